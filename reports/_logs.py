"""Which logs in a log directory count, and whether they are healthy: the one rule.

``trials_frame(LOG_DIR)``, ``twice report``, ``twice gate`` and ``twice run``'s summary all
count the logs :func:`read_log_dir` picks, so the four never disagree about a directory.

A resumed ``eval_set`` leaves the log of the interrupted attempt beside the log that finished
the task (both carry the task's ``task_id``). Reading every file would count the reused trials
twice, so only the newest log of each task counts. And a directory run again with a changed
suite (an edited prompt file, a dropped model) keeps the old logs too: when the directory has
inspect's ``eval-set.json``, only the tasks of the last run count, as in ``summary.json``.
Logs that do not count are *superseded* and stay on disk as an audit trail (nothing already
written is deleted).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from inspect_ai.log import read_eval_log


class LogReadError(Exception):
    """A log directory that is missing, empty, or holds a log that cannot be read."""


def log_files(log_dir: str | Path) -> list[Path]:
    """Every ``.eval``/``.json`` inspect log under ``log_dir`` (counted or superseded).

    Raises:
        LogReadError: when the directory is missing or holds no logs.
    """
    root = Path(log_dir)
    if not root.is_dir():
        raise LogReadError(f"log directory {str(root)!r} does not exist")
    files = sorted(
        p
        for p in root.rglob("*")
        if p.suffix in (".eval", ".json")
        and p.is_file()
        and not p.name.startswith(("logs", "summary", "eval-set"))
        and p.name != "summary.json"
    )
    if not files:
        raise LogReadError(
            f"log directory {str(root)!r} holds no inspect logs (*.eval or *.json); "
            "run `twice run --log-dir DIR` first"
        )
    return files


@dataclass(frozen=True)
class LogEntry:
    """The header facts of one inspect log."""

    path: Path
    task: str
    model: str
    status: str
    """``success``, ``error``, ``cancelled`` or ``started`` (a run killed mid-way)."""
    task_id: str
    created: str
    error: str
    """The eval-level error message, empty when none."""


@dataclass(frozen=True)
class LogDir:
    """The logs of one directory: the newest per task, and the superseded attempts."""

    root: Path
    current: tuple[LogEntry, ...]
    superseded: tuple[LogEntry, ...]
    """Older attempts of a task, and logs of tasks the last run did not include."""
    missing: tuple[str, ...] = ()
    """Tasks the last run planned (``eval-set.json``) that have no log at all."""

    @property
    def files(self) -> list[Path]:
        """The log files that count (newest per task)."""
        return [e.path for e in self.current]

    def problems(self) -> list[str]:
        """One line per counted log that did not finish successfully."""
        lines = []
        for e in self.current:
            if e.status != "success":
                why = f": {e.error}" if e.error else ""
                lines.append(f"{e.path.name} ({e.task} on {e.model}) has status {e.status!r}{why}")
        lines += [f"{m} has no log: the run stopped before it started" for m in self.missing]
        return lines


def _entry(path: Path) -> LogEntry:
    try:
        log = read_eval_log(str(path), header_only=True)
    except Exception as ex:  # inspect raises zip, JSON and validation errors alike
        raise LogReadError(
            f"log {str(path)!r} cannot be read ({type(ex).__name__}: {ex}); "
            "it is corrupt or not an inspect log: move it out of the directory"
        ) from None
    return LogEntry(
        path=path,
        task=log.eval.task,
        model=log.eval.model,
        status=log.status,
        task_id=log.eval.task_id or str(path),
        created=str(log.eval.created),
        error=log.error.message if log.error else "",
    )


def _planned(root: Path) -> dict[str, str] | None:
    """Task id → description of the tasks of the last ``eval_set`` run into ``root``."""
    path = root / "eval-set.json"
    if not path.is_file():
        return None
    try:
        tasks = json.loads(path.read_text(encoding="utf-8"))["tasks"]
        return {
            t["task_id"]: f"task {t['name']} on {t['model']} ({json.dumps(t.get('task_args', {}))})"
            for t in tasks
        }
    except (ValueError, KeyError, TypeError) as ex:
        raise LogReadError(
            f"{str(path)!r} cannot be read ({type(ex).__name__}: {ex}); it lists the tasks of "
            "the last run: rerun `twice run` with the same --log-dir to rewrite it"
        ) from None


def read_log_dir(log_dir: str | Path) -> LogDir:
    """Read the headers of every log in ``log_dir`` and pick the ones that count.

    Those are the newest log of each task, restricted to the tasks of the last run when the
    directory holds inspect's ``eval-set.json``.

    Raises:
        LogReadError: when the directory is missing, holds no logs, or holds a log that
            cannot be read (naming it).
    """
    root = Path(log_dir)
    entries = [_entry(p) for p in log_files(root)]
    planned = _planned(root)
    newest: dict[str, LogEntry] = {}
    for e in sorted(entries, key=lambda e: (e.created, e.path.name)):
        if planned is None or e.task_id in planned:
            newest[e.task_id] = e
    current = tuple(newest.values())
    kept = {e.path for e in current}
    superseded = tuple(e for e in entries if e.path not in kept)
    missing = tuple(desc for tid, desc in (planned or {}).items() if tid not in newest)
    if not current:
        raise LogReadError(
            f"log directory {str(root)!r} holds no logs of the tasks in its eval-set.json; "
            "rerun `twice run` with the same --log-dir"
        )
    return LogDir(root, current, superseded, missing)


def check_log_dir(log_dir: str | Path) -> None:
    """Check that an existing log directory can be resumed into (every log readable).

    A directory that does not exist yet, or holds no logs, is fine.

    Raises:
        LogReadError: naming a log that cannot be read.
    """
    root = Path(log_dir)
    if not root.is_dir():
        return
    try:
        files = log_files(root)
    except LogReadError:
        return  # no logs yet: a fresh run
    for path in files:
        _entry(path)
