"""What a run writes besides inspect's logs: files replaced by rename (never left
half-written, API keys scrubbed), and a log directory checked before the run takes it."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from twice.mocks import RunError
from twice.reports import (
    SHARD_DIR,
    Location,
    as_location,
    find_relative,
    is_remote,
    is_stream,
    join,
    make_dirs,
    replace_local,
    write_summary,
    write_text,
)
from twice.tasks import scrub, secret_values

from ..suite import SuiteError


def write_atomic(path: Location, write: Callable[[Path], object]) -> Location:
    """Have ``write(tmp)`` write beside ``path``, scrub API keys from it, rename it in place.

    A failed or interrupted write leaves the previous file whole (and no temp file). For an
    fsspec URI the file is written locally first, then uploaded whole in one put.
    """
    if is_remote(path):
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / "out"
            write(local)
            write_text(path, scrub(local.read_text(encoding="utf-8"), secret_values()))
        return path
    path = Path(as_location(path))  # a file:// URI as the path it names

    def write_scrubbed(tmp: Path) -> None:
        write(tmp)
        secrets = secret_values()
        if secrets:
            text = tmp.read_text(encoding="utf-8")
            clean = scrub(text, secrets)
            if clean != text:
                tmp.write_text(clean, encoding="utf-8")

    return replace_local(path, write_scrubbed)


_RUN_FILES = ("summary.json", "eval-set.json", "logs.json")


def refuse_runs_inside(log_dir: Location) -> None:
    """Refuse a log directory that holds another run's logs in a subdirectory (its own
    ``shard-i-of-n`` directories aside).

    inspect's eval_set lists a log directory recursively: a run into ``logs`` would take the
    logs of ``logs/run-41`` for its own, reuse or never finish their cells, and clean up the
    ones it judged stale, deleting that run's finished work.

    Raises:
        SuiteError: naming the first such directory.
    """
    for parts in find_relative(log_dir):
        if len(parts) < 2 or (len(parts) == 2 and SHARD_DIR.match(parts[0])):
            continue  # the run's own files, or its shards'
        if parts[-1] in _RUN_FILES or parts[-1].endswith(".eval"):
            inside = str(join(log_dir, *parts[:-1]))
            raise SuiteError(
                f"log directory {str(log_dir)!r} holds another run's logs in {inside!r}; "
                "inspect reads a log directory with everything under it, so this run would "
                "take those logs for its own and could delete them: give each run a "
                "directory of its own, beside the others, not above them"
            )


def prepare_log_dir(log_dir: Location) -> None:
    try:
        make_dirs(log_dir)
    except OSError as ex:
        raise SuiteError(
            f"log directory {str(log_dir)!r} cannot be created: {ex.strerror or ex}; "
            "pass a --log-dir you can write to"
        ) from None
    refuse_runs_inside(log_dir)
    if is_remote(log_dir):
        return
    # Written after every trial has run: twice's summary and report, inspect's listing of the
    # logs (logs.json) and its eval-set bookkeeping (eval-set.json).
    for name in ("summary.json", "report.html", "logs.json", "eval-set.json"):
        path = Path(as_location(join(log_dir, name)))
        if path.is_dir():
            raise SuiteError(
                f"{str(path)!r} is a directory; twice writes its {name} there: move it away"
            )
        if is_stream(path):  # a FIFO would hold the run's first summary write for ever
            raise SuiteError(
                f"{str(path)!r} is not a regular file (a FIFO or a device); twice writes its "
                f"{name} there: move it away"
            )


class RunOutputError(RunError, OSError):
    """A file of the run's own (``summary.json``, ``report.html``) could not be written after
    the trials ran (a full disk, ``ulimit -f``): the run fails (exit 1), its logs stay."""

    def __init__(self, message: str, *, summary_written: bool) -> None:
        super().__init__(message)
        self.summary_written = summary_written
        """Whether ``summary.json`` holds the run's counts (only the report failed)."""


def write_run_file(
    path: Location,
    write: Callable[[Path], object],
    summary_path: Location,
    run: dict[str, Any],
    fields: dict[str, Any],
) -> Location:
    """:func:`write_atomic`, with an ``OSError`` turned into :class:`RunOutputError`. When
    ``summary.json`` itself fails, it is marked incomplete with no counts (a small file may
    fit where the large one did not): left saying "running", it would claim a live run."""
    try:
        return write_atomic(path, write)
    except OSError as ex:
        why = f"cannot write {str(path)!r}: {ex.strerror or ex}"
        if path != summary_path:
            raise RunOutputError(why, summary_written=True) from None
        marked = {**fields, "complete": False, "status": "incomplete", "error": why}
        try:
            write_atomic(
                summary_path, lambda tmp: write_summary(pd.DataFrame(), tmp, run=run, **marked)
            )
        except OSError:
            why += " (nor could it be marked incomplete)"
        raise RunOutputError(why, summary_written=False) from None
