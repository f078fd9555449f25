"""Which logs in a log directory count, and whether they are healthy.

A resumed ``eval_set`` leaves the log of the interrupted attempt beside the log that finished
the task (both carry the task's ``task_id``). Reading every file would count the reused trials
twice, so only the newest log of each task counts; the older ones are *superseded* and kept on
disk as an audit trail (nothing already written is deleted).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inspect_ai.log import read_eval_log

from reports import LogReadError, log_files


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


def read_log_dir(log_dir: str | Path) -> LogDir:
    """Read the headers of every log in ``log_dir`` and keep the newest per task.

    Raises:
        LogReadError: when the directory is missing, holds no logs, or holds a log that
            cannot be read (naming it).
    """
    entries = [_entry(p) for p in log_files(log_dir)]
    newest: dict[str, LogEntry] = {}
    for e in sorted(entries, key=lambda e: (e.created, e.path.name)):
        newest[e.task_id] = e
    current = tuple(newest.values())
    kept = {e.path for e in current}
    superseded = tuple(e for e in entries if e.path not in kept)
    return LogDir(Path(log_dir), current, superseded)


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
