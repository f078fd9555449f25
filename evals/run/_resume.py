"""Resume: which planned cells a log directory already holds finished, which of its
errored trials the next ``eval_set`` runs again, and runs refused because fewer trials would
drop or miscount the ones there."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from inspect_ai import Task
from inspect_ai.log import EvalLog
from twice.reports import (
    Location,
    LogDir,
    LogEntry,
    LogReadError,
    as_location,
    file_stamp,
    is_remote,
    read_log_dir,
    replace_local,
)
from twice.tasks import load_prompt

from ..suite import Cell, Suite, SuiteError
from ._settings import PreparedRun


def finished_cells(
    log_dir: Location, planned: list[Cell]
) -> tuple[set[Cell], list[Location], bool]:
    """The planned cells with a finished log, the log files that count for them, and
    whether one of those logs was cancelled (an interrupted run).

    One rule with ``twice gate`` and ``twice report``: the newest log of each task of the
    last run (``read_log_dir``). A log is a planned cell's when its header's twice record
    (model, task, fault, protection, prompt name and digest) is that cell's.
    """
    return finished_in(read_or_none(log_dir), planned)


def finished_in(logs: LogDir | None, planned: list[Cell]) -> tuple[set[Cell], list[Location], bool]:
    """:func:`finished_cells` of a directory already read (None: none to read)."""
    matched = matched_logs(logs, planned) if logs is not None else []
    finished = {cell for cell, entry in matched if entry.status == "success"}
    cancelled = any(entry.status == "cancelled" for _, entry in matched)
    return finished, [entry.path for _, entry in matched], cancelled


def matched_logs(logs: LogDir, planned: list[Cell]) -> list[tuple[Cell, LogEntry]]:
    """Each counted log of ``logs`` that belongs to a planned cell, with its cell."""
    by_key: dict[tuple[Cell, str], Cell] = {}
    for cell in planned:
        p = load_prompt(cell.prompt)
        by_key[replace(cell, prompt=p.name), p.sha256] = cell
    out = []
    for entry in logs.current:
        # read_log_dir read each header once and kept its twice record: not read again here
        # (every run reads the directory at its start and at its end).
        meta = entry.twice
        try:
            key = (Cell.from_mapping({**meta, "model": entry.model}), str(meta["prompt_sha256"]))
        except KeyError:
            continue  # not a twice log of this suite
        match = by_key.get(key)
        if match is not None:
            out.append((match, entry))
    return out


def read_or_none(log_dir: Location) -> LogDir | None:
    try:
        return read_log_dir(log_dir)
    except LogReadError:
        return None


def samples_per_epoch(task: Task, suite: Suite) -> int:
    """The samples of ``task`` a run of ``suite`` plans in each epoch (its ``--limit``)."""
    size = len(task.dataset)
    return min(suite.limit or size, size)


def refuse_fewer_trials(logs: LogDir | None, run: PreparedRun, suite: Suite) -> None:
    """Refuse a run whose cells would have fewer trials than their finished logs hold.

    Inspect reuses a log with more samples than a smaller ``--limit`` asks for (and the cell
    then counts the old trials: 6 where a fresh run has 4), and rewrites one with more
    epochs than asked, dropping the rest. Either way the directory no longer says what the
    command ran, so the command is refused. More epochs or a larger limit extend the logs.

    Raises:
        SuiteError: naming the directory's epochs and samples per cell and the run's.
    """
    if logs is None:
        return
    tasks = dict(zip(run.planned, run.tasks, strict=True))
    for cell, entry in matched_logs(logs, run.planned):
        task = tasks[cell]
        if entry.version != str(task.version):
            continue  # written by other code or data (an edited task): stale, it reruns
        samples = samples_per_epoch(task, suite)
        if suite.epochs < entry.epochs or samples < entry.samples:
            raise SuiteError(
                f"log directory {str(run.log_dir)!r} holds cell {cell.label} run "
                f"with {entry.samples} sample(s) × {entry.epochs} epoch(s); this run asks for "
                f"{samples} × {suite.epochs}, and fewer would count the old trials or drop "
                "them: give it another --log-dir, or an --epochs and --limit no smaller"
            )


def rerun_errored(logs: LogDir | None, planned: list[Cell]) -> None:
    """Have the next ``eval_set`` run again the errored trials of the planned cells' finished
    logs, reusing their clean ones.

    Inspect counts a log whose trials partly errored as finished (``fail_on_error=False``),
    so a rerun after the endpoint (or the task) was fixed reused the errors and exited 1
    again. Their samples are invalidated, inspect's own mark for "run this again" that its
    ``eval_set`` honours (the log is rewritten whole; the retry's log then replaces it).
    """
    from inspect_ai.log import ProvenanceData, invalidate_samples, read_eval_log

    if logs is None:
        return
    for _, entry in matched_logs(logs, planned):
        if entry.status != "success" or not entry.unfinished:
            continue
        log = read_eval_log(str(entry.path))
        errored = [s.uuid for s in log.samples or [] if s.error is not None and s.uuid]
        if not errored:
            continue
        reason = "an errored trial, run again when the run resumes"
        log = invalidate_samples(log, errored, ProvenanceData(author="twice", reason=reason))
        _rewrite_log(log, entry.path)


def _rewrite_log(log: EvalLog, path: Location) -> None:
    """Write ``log`` over ``path`` whole: a local file through a temporary beside it, so an
    interrupted write leaves the old log (an object store's put is whole already)."""
    from inspect_ai.log import write_eval_log

    fmt: Literal["eval", "json"] = "json" if str(path).endswith(".json") else "eval"
    if is_remote(path):
        write_eval_log(log, str(path), format=fmt)
        return
    replace_local(as_location(path), lambda tmp: write_eval_log(log, str(tmp), format=fmt))


def finished_logs(logs: LogDir | None, planned: list[Cell]) -> dict[Cell, tuple[str, Any]]:
    """Each planned cell with a finished log: the log's path and size/mtime (None remote)."""
    if logs is None:
        return {}
    return {
        cell: (str(entry.path), file_stamp(str(entry.path)))
        for cell, entry in matched_logs(logs, planned)
        if entry.status == "success"
    }
