"""What the commands share: the log-directory option type, the checks of paths, model
arguments and numbers given on the command line, and reading a log directory's trials."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click


class _LocationType(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.5 on
    """A path or an fsspec URI, kept a string (``Path("s3://b/x")`` is ``s3:/b/x``), that is not
    a URI written with one slash: ``s3:/b/x`` would be a local directory named ``s3:``."""

    name = "location"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from twice.reports import misspelt_uri

        text = str(value)
        if not text.strip():  # an unset CI variable: never the current directory or a default
            hint = None
            if param is not None:
                hint = (
                    param.opts[0] if isinstance(param, click.Option) else param.human_readable_name
                )
            raise click.BadParameter(
                "is empty; give a path or URI (an unset variable makes an empty one)",
                ctx=ctx,
                param_hint=hint,
            )
        meant = misspelt_uri(text)
        if meant is not None:
            self.fail(
                f"{text!r} is a URI with one slash after its scheme, which would be a local "
                f"directory of that name: write {meant!r} (or ./{text} for a local path)",
                param,
                ctx,
            )
        problem = unusable_path(text)
        if problem is not None:
            self.fail(problem, param, ctx)
        return home_expanded(text)


LOCATION = _LocationType()


def home_expanded(location: str) -> str:
    """``location`` with a leading ``~`` or ``~user`` expanded, as a shell would have.

    Inspect writes through fsspec, which expands it, so a quoted ``'~/run'`` (or one from a
    CI variable) put inspect's files in ``$HOME/run`` and twice's in ``./~/run``: one rule
    for every path written, the shell's. A URI is left as it is; ``./~`` stays literal.
    """
    from twice.reports import is_remote

    if is_remote(location) or not location.startswith("~"):
        return location
    return os.path.expanduser(location)


NAME_MAX = 255
"""The longest file or directory name most local filesystems take (ext4, XFS, APFS, NTFS)."""


def unusable_path(location: str) -> str | None:
    """Why ``location`` cannot name a local file or directory twice writes, or None.

    A control character (a newline from a pasted or quoted name) makes a directory no listing
    shows plainly, and the logs' names carry it into every line that quotes them; a
    component over :data:`NAME_MAX` bytes fails only when the first file is written, after
    the suite has started.
    """
    from twice.reports import is_remote

    bad = next((c for c in location if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        return (
            f"{location!r} holds the control character {bad!r}; give a path or URI without "
            "newlines, tabs or other control characters"
        )
    if is_remote(location):
        return None
    long = next(
        (p for p in home_expanded(location).split(os.sep) if len(os.fsencode(p)) > NAME_MAX),
        None,
    )
    if long is not None:
        return (
            f"{location[:60]!r}... has a component of {len(os.fsencode(long))} bytes; a file "
            f"or directory name may have at most {NAME_MAX}"
        )
    return None


MODEL_ARG_LIMIT = 100_000
"""The most a ``-M`` value may hold: items and string characters, counted as the logs would
write them out (an alias repeats what it names each time)."""


def _expanded_size(value: Any, budget: int) -> int:
    """How big ``value`` is written out (each item 1, each string its length), counted up
    to just over ``budget``: YAML aliases share one object, so a few hundred bytes of
    anchors can stand for billions of items (or a cycle) that every log header copies."""
    size = 0
    stack = [value]
    while stack and size <= budget:
        item = stack.pop()
        size += 1
        if isinstance(item, str | bytes):
            size += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set):
            stack.extend(item)
    return size


def parse_model_args(values: tuple[str, ...]) -> dict[str, Any]:
    import yaml

    args: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not key=value", param_hint="-M")
        too_big = (
            f"the value of {key!r} is larger than {MODEL_ARG_LIMIT:,} items and characters "
            "written out (YAML aliases repeat what they name); a model argument is a setting: "
            "give a smaller value"
        )
        if len(value) > MODEL_ARG_LIMIT:
            raise click.BadParameter(too_big, param_hint="-M")
        try:
            args[key] = yaml.safe_load(value)  # same typing as inspect's -M
        except yaml.YAMLError as ex:
            # The value may be a secret pasted by mistake: name the key, not the value.
            mark = getattr(ex, "problem_mark", None)
            where = f" (column {mark.column + 1})" if mark is not None else ""
            problem = getattr(ex, "problem", None) or type(ex).__name__
            raise click.BadParameter(
                f"the value of {key!r} is not valid YAML{where}: {problem}; quote a string "
                "value, e.g. -M 'key=\"text\"'",
                param_hint="-M",
            ) from None
        if _expanded_size(args[key], MODEL_ARG_LIMIT) > MODEL_ARG_LIMIT:
            raise click.BadParameter(too_big, param_hint="-M")
    return args


def one_agent_cmd(commands: tuple[str, ...]) -> str | None:
    """The one ``--agent-cmd`` given (click keeps only the last of a repeated option, so a
    second command would silently never run)."""
    if len(commands) > 1:
        from twice.tasks import remember_command_secrets, scrub, secret_values

        for command in commands:
            remember_command_secrets(command)
        shown = ", ".join(repr(scrub(c, secret_values())) for c in commands)
        raise click.BadParameter(
            f"given {len(commands)} times ({shown}); a run has one "
            "agent command: run each in its own --log-dir",
            param_hint="--agent-cmd",
        )
    return commands[0] if commands else None


def check_writable_output(output: str | Path, what: str) -> None:
    """Refuse an output path (or ``file://`` URI) whose directory cannot be made or written,
    before any work."""
    from twice.reports import as_location, is_stream, local_target

    given = Path(as_location(output))
    if is_stream(given):  # /dev/stdout, a FIFO: written into (replace_local)
        if not os.access(given, os.W_OK):
            raise click.BadParameter(f"cannot write to {str(given)!r}", param_hint=what)
        return
    try:  # through a symlink to what it names: that is the file written (replace_local)
        path = local_target(given)
    except OSError as ex:
        raise click.BadParameter(
            f"cannot write {str(given)!r}: {ex.strerror or ex}", param_hint=what
        ) from None
    parent = path.parent
    blocker = next((p for p in (parent, *parent.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise click.BadParameter(
            f"cannot write {str(path)!r}: {str(blocker)!r} is not a directory", param_hint=what
        )
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as ex:
        raise click.BadParameter(
            f"cannot create the directory of {str(path)!r}: {ex.strerror or ex}",
            param_hint=what,
        ) from None
    if path.is_dir():
        raise click.BadParameter(f"{str(path)!r} is a directory; expected a file", param_hint=what)
    if not os.access(parent, os.W_OK):
        raise click.BadParameter(f"cannot write to {str(parent)!r}", param_hint=what)


def default_display() -> str:
    """Inspect's progress display when ``--display`` is not given.

    ``INSPECT_DISPLAY`` wins when set. On a terminal: ``rich`` (live progress that stays in
    the scrollback above twice's table, unlike the full-screen ``full``). In CI or when output
    is piped: ``plain`` (static lines a log file can hold: each cell's start and result).
    """
    if os.environ.get("INSPECT_DISPLAY"):
        return os.environ["INSPECT_DISPLAY"].strip().lower()
    if os.environ.get("CI") or not sys.stdout.isatty():
        return "plain"
    return "rich"


def finite_values(values: tuple[float, ...], hint: str, example: str = "0.01") -> tuple[float, ...]:
    # Every comparison with NaN is false, so click's range check lets "nan" through.
    what = "a rate" if hint == "--rate" else "a number"
    for v in values:
        if math.isnan(v):
            raise click.BadParameter(
                f"{v!r} is not a number; expected {what} strictly between 0 and 1, e.g. {example}",
                param_hint=hint,
            )
    return values


def read_trials(log_dir: str, what: str, *, write: bool = True) -> tuple[Any, Any]:
    """Read a log directory for gate/report: (LogDir, trial frame); LogReadError → exit 2.

    A directory of shards is merged, and (unless ``write`` is False: a baseline is only read)
    its merged ``summary.json`` written, recording them and the shards' status.
    """
    from twice.reports import LogReadError, StorageError

    from ..scale import mark_unmerged, merge

    try:
        merged = merge(log_dir, write=write)
        return merged.logs, merged.frame
    except LogReadError as ex:
        # A merged summary.json left as it was would still say "complete" of what is refused.
        if write and not isinstance(ex, StorageError):
            with contextlib.suppress(LogReadError):
                mark_unmerged(log_dir, str(ex))
        raise click.BadParameter(str(ex), param_hint=what) from None


SHOWN_PROBLEMS = 20
"""Problems a gate lists one by one; an interrupted run's hundreds of trials are counted."""


def echo_some(problems: list[str], label: str) -> None:
    for line in problems[:SHOWN_PROBLEMS]:
        click.echo(f"{label}: {line}", err=True)
    if len(problems) > SHOWN_PROBLEMS:
        click.echo(f"{label}: ... and {len(problems) - SHOWN_PROBLEMS} more", err=True)


def errored_lines(logs: Any, frame: Any) -> list[str]:
    from twice.reports import Cell, errored

    problems: list[str] = list(logs.problems())
    for row in frame[errored(frame)].itertuples():
        first = str(row.error).strip().splitlines()[0] if row.error else "not scored"
        problems.append(
            f"trial {row.sample} epoch {row.epoch} of "
            f"{Cell.from_mapping(row._asdict()).label} errored: {first}"
        )
    return problems


def say_uncounted(log_dir: str, cells: list[str], why: str) -> None:
    """Warn that ``log_dir`` holds an earlier run's logs of other cells, which nothing counts:
    a second run into the same directory replaced the first's results without a word."""
    if not cells:
        return
    shown = "; ".join(cells[:3]) + (f"; and {len(cells) - 3} more" if len(cells) > 3 else "")
    click.echo(
        f"twice: {log_dir} also holds logs of {len(cells)} cell(s) {why} ({shown}): an "
        "earlier run's, kept on disk but counted in no summary, report or gate. Give each "
        "run its own --log-dir, or run all the cells in one command.",
        err=True,
    )


OWN_PROCESS = False
"""Set by the console script's ``main``: the process is twice's to end (not a test's
``CliRunner`` or a library caller's, whose signal handlers twice must leave alone)."""
_EXITING_FOR_A_SIGNAL = False
"""Set by :func:`another_signal_exits` in twice's own process: its exit is the run's code."""


def another_signal_exits(code: int) -> None:
    """After a run stopped for a signal and wrote its summary, only printing and the
    interpreter's exit are left: a second Ctrl-C there ends the process at once with the
    run's own code. Python's handler would raise KeyboardInterrupt into the exit instead, and
    the process would die by SIGINT (a shell reads 130 either way; a supervisor reading the
    exit status does not). Only in twice's own process."""

    def now(signum: int, frame: object) -> None:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)

    global _EXITING_FOR_A_SIGNAL
    if OWN_PROCESS and threading.current_thread() is threading.main_thread():
        _EXITING_FOR_A_SIGNAL = True
        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, now)


def signals_cannot_end_the_exit() -> None:
    """``main``'s first exit handler, so the last to run: after a run stopped for a signal,
    ignore SIGINT and SIGTERM for the rest of the interpreter's exit.

    Python puts every signal back to its default action once the exit handlers have run,
    while it still tears down modules (the interpreter's last seconds on a loaded machine):
    a second Ctrl-C there would kill the process by the signal, not end it with the run's
    own code. Nothing is left to stop by then.
    """
    if _EXITING_FOR_A_SIGNAL:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
