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
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from inspect_ai.log import EvalLog, read_eval_log

from ._cell import CELL, Cell
from ._shards import (
    ShardSet,
    find_shards,
    require_complete,
    require_one_suite,
    shard_summaries,
)
from ._storage import (
    Location,
    LogReadError,
    as_location,
    file_stamp,
    find_files,
    is_dir,
    is_file,
    is_remote,
    join,
    list_dir,
    list_files,
    name_of,
    read_text,
)


def log_files(log_dir: Location) -> list[Location]:
    """Every ``.eval``/``.json`` inspect log in ``log_dir`` (counted or superseded), not in its
    subdirectories: a directory is one run (``eval_set`` writes its logs at its top), and
    a folder holding several runs' directories must not pool them into one.

    ``log_dir`` may be a path or an fsspec URI (``s3://bucket/run``).

    Raises:
        LogReadError: when the directory is missing or holds no logs.
    """
    root = as_location(log_dir)
    if not is_dir(root):
        # A FIFO or a device is no more a log directory than a file is; "does not exist"
        # would send the user looking for a typo.
        if is_file(root) or (not is_remote(root) and os.path.exists(root)):
            raise LogReadError(
                f"{str(root)!r} is a file, not a log directory; pass the directory of a run "
                "(its --log-dir)"
            )
        raise LogReadError(f"log directory {str(root)!r} does not exist")
    files = [p for p in list_files(root) if _is_log(p)]
    if not files:
        runs = [name_of(d) for d in list_dir(root) if is_dir(d) and _holds_logs(d)]
        if runs:
            raise LogReadError(
                f"log directory {str(root)!r} holds no inspect logs of its own, but its "
                f"subdirectories {', '.join(runs[:5])}{' ...' if len(runs) > 5 else ''} do: "
                "each is a run of its own; pass one of them (runs are not pooled)"
            )
        raise LogReadError(
            f"log directory {str(root)!r} holds no inspect logs (*.eval or *.json); "
            "run `twice run --log-dir DIR` first"
        )
    return files


def _holds_logs(directory: Location) -> bool:
    return any(_is_log(p) for p in find_files(directory))


def _is_log(path: Location) -> bool:
    name = name_of(path)
    return name.endswith((".eval", ".json")) and not name.startswith(
        ("logs", "summary", "eval-set", ".")
    )


def run_split(log_dir: Location) -> int | None:
    """How the run already in ``log_dir`` is split: ``n`` for its ``shard-i-of-n``
    directories, 1 for the logs of a one-process run (at its top level), None for a directory
    that does not exist or holds neither. A run resumed into it must be split the same way:
    the other layout's logs would not count (:func:`read_log_dir`).

    Raises:
        LogReadError: when the directory mixes shard counts.
    """
    root = as_location(log_dir)
    shards = find_shards(root)
    if shards is not None:
        return shards.count
    return 1 if any(_is_log(p) for p in list_dir(root) if is_file(p)) else None


@dataclass(frozen=True)
class LogEntry:
    """The header facts of one inspect log."""

    path: Location
    task: str
    model: str
    status: str
    """``success``, ``error``, ``cancelled`` or ``started`` (a run killed mid-way)."""
    task_id: str
    created: str
    error: str
    """The eval-level error message, empty when none."""
    twice: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    """The header's ``metadata["twice"]`` (the cell a twice log belongs to), empty when
    none: readers that match logs to cells need not read the header again."""
    unfinished: int = 0
    """Samples the log planned that did not finish (a finished log's errored trials)."""
    epochs: int = 1
    """The epochs the log ran (or plans) of each sample."""
    samples: int = 0
    """The samples it ran (or plans) in each epoch: its ``--limit`` of its dataset."""
    version: str = ""
    """The task's version when the log was written (a user task's carries its code's and
    dataset's digests: another version's log is stale, not this run's)."""


@dataclass(frozen=True)
class LogDir:
    """The logs of one directory: the newest per task, and the superseded attempts."""

    root: Location
    current: tuple[LogEntry, ...]
    superseded: tuple[LogEntry, ...]
    """Older attempts of a task, and logs of tasks the last run did not include."""
    missing: tuple[str, ...] = ()
    """Tasks the last run planned (``eval-set.json``) that have no log at all."""
    shards: ShardSet | None = None
    """The shard directories merged into this one, when the run was sharded."""
    shard_summaries: Mapping[int, Mapping[str, Any]] = field(
        default_factory=dict, hash=False, compare=False
    )
    """Each shard's own ``summary.json`` by index, as read with the logs."""

    @property
    def files(self) -> list[Location]:
        """The log files that count (newest per task)."""
        return [e.path for e in self.current]

    def uncounted_cells(self) -> list[str]:
        """The cells (``model / prompt / task / fault / protection``, and the agent when it is
        not twice's own) whose only logs here are superseded: an earlier run's, with other
        cells, into the same directory. They stay on disk and nothing counts them, so a
        reader who expected them must be told."""
        counted = {_cell_of(e) for e in self.current}
        labels = []
        for e in self.superseded:
            cell = _cell_of(e)
            if cell is None or cell in counted:
                continue
            counted.add(cell)  # once per cell
            labels.append(cell.label)
        return labels

    def problems(self) -> list[str]:
        """One line per counted log that did not finish successfully."""
        lines = []
        for e in self.current:
            if e.status != "success":
                why = f": {e.error}" if e.error else ""
                lines.append(
                    f"{name_of(e.path)} ({e.task} on {e.model}) has status {e.status!r}{why}"
                )
        lines += [
            f"{m} has no log: the run stopped before it started, or has not reached it yet"
            for m in self.missing
        ]
        return lines


Stamped = tuple[tuple[int, int], EvalLog]
"""A log's header with the size and modification time of the file it was read from."""

_HEADERS: OrderedDict[str, Stamped] = OrderedDict()
_HEADERS_KEPT = 512
"""Headers kept per process (tens of KB each): a run's logs, not a serve's lifetime of them."""
_HEADERS_LOCK = threading.Lock()  # a process may read logs from more than one thread


def read_header(path: Location) -> EvalLog:
    """A log's header (inspect's header-only read), read once per process while the file is
    unchanged: a run reads each header to pick the logs that count, again for their trials'
    rows, and a ``--workers`` parent again for the merge (57 logs: ~0.3 s each time).
    Remote logs are read every time (no cheap way to tell a rewritten one). The header is
    shared: callers must not change it."""
    key = str(path)
    stamp = file_stamp(key)
    if stamp is not None:
        with _HEADERS_LOCK:
            hit = _HEADERS.get(key)
            if hit is not None and hit[0] == stamp:
                _HEADERS.move_to_end(key)
                return hit[1]
    log = read_eval_log(key, header_only=True)
    if stamp is not None:
        remember_headers({key: (stamp, log)})
    return log


def known_headers(paths: Iterable[str]) -> dict[str, Stamped]:
    """The headers this process has read of ``paths``, stamped (to hand to another process)."""
    with _HEADERS_LOCK:
        return {p: _HEADERS[p] for p in paths if p in _HEADERS}


def remember_headers(headers: Mapping[str, Stamped]) -> None:
    """Take headers another process read (:func:`known_headers`): each is used only while its
    file still has the size and modification time it had then."""
    with _HEADERS_LOCK:
        for key, stamped in headers.items():
            _HEADERS[key] = stamped
            _HEADERS.move_to_end(key)
        while len(_HEADERS) > _HEADERS_KEPT:
            _HEADERS.popitem(last=False)


def _entry(path: Location) -> LogEntry:
    try:
        log = read_header(path)
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
        twice=_twice_record(log.eval.metadata),
        unfinished=_unfinished(log.results),
        epochs=int(log.eval.config.epochs or 1),
        samples=_samples(log.eval.dataset, log.eval.config.limit),
        version=str(log.eval.task_version),
    )


def _samples(dataset: Any, limit: Any) -> int:
    if dataset.sample_ids:
        return len(dataset.sample_ids)
    size = int(dataset.samples or 0)
    if isinstance(limit, int):
        return min(limit, size)
    if isinstance(limit, tuple | list) and len(limit) == 2:
        return max(0, min(int(limit[1]), size) - int(limit[0]))
    return size


def _unfinished(results: Any) -> int:
    if results is None:
        return 0
    return max(0, int(results.total_samples or 0) - int(results.completed_samples or 0))


def _twice_record(metadata: Any) -> Mapping[str, Any]:
    record = metadata.get("twice") if isinstance(metadata, Mapping) else None
    return record if isinstance(record, Mapping) else {}


def _planned(root: Location) -> dict[str, str] | None:
    """Task id → description of the tasks of the last ``eval_set`` run into ``root``."""
    path = join(root, "eval-set.json")
    if not is_file(path):
        return None
    try:
        tasks = json.loads(read_text(path))["tasks"]
        return {
            t["task_id"]: f"task {t['name']} on {t['model']} ({json.dumps(t.get('task_args', {}))})"
            for t in tasks
        }
    except (ValueError, KeyError, TypeError) as ex:
        raise LogReadError(
            f"{str(path)!r} cannot be read ({type(ex).__name__}: {ex}); it lists the tasks of "
            "the last run: rerun `twice run` with the same --log-dir to rewrite it"
        ) from None


def read_log_dir(log_dir: Location, *, partial: bool = False) -> LogDir:
    """Read the headers of every log in ``log_dir`` and pick the ones that count.

    Those are the newest log of each task, restricted to the tasks of the last run when the
    directory holds inspect's ``eval-set.json``. A directory of ``shard-i-of-n``
    subdirectories (``twice run --shard``/``--workers``) is read as one run: each shard by its
    own ``eval-set.json``; logs beside the shard directories do not count. ``log_dir`` may be
    an fsspec URI (``s3://bucket/run``).

    Args:
        log_dir: The directory (a path or an fsspec URI).
        partial: Read what there is of a run known to have ended early (a ``--workers`` run
            whose worker died): a missing shard is read as empty instead of refused, and the
            caller reports its cells as missing.

    Raises:
        LogReadError: when the directory is missing, holds no logs, holds a log that cannot be
            read (naming it), lacks one of its shards (naming it) or holds shards of different
            suites.
    """
    root = as_location(log_dir)
    shards = find_shards(root)
    if shards is None:
        return _read_one(root, allow_empty=False)
    summaries = shard_summaries(shards)
    if not partial:
        require_complete(shards, root, summaries)
    require_one_suite(shards, root, summaries)
    parts = [
        _with_unfinished(_read_one(shards.dirs[i], allow_empty=True), summaries[i])
        for i in sorted(shards.dirs)
    ]
    _require_disjoint(parts, root)
    current = tuple(e for p in parts for e in p.current)
    beside = tuple(_entry(p) for p in log_files(root)) if _has_logs(root) else ()
    if not current:
        raise LogReadError(
            f"log directory {str(root)!r} has all {shards.count} shard(s) but none holds a "
            "log; rerun `twice run --shard i/n` into it"
        )
    return LogDir(
        root,
        current,
        tuple(e for p in parts for e in p.superseded) + beside,
        tuple(m for p in parts for m in p.missing),
        shards,
        summaries,
    )


def _cell_of(e: LogEntry) -> Cell | None:
    """The cell a twice log belongs to, its prompt by name (None: not a twice log)."""
    try:
        return Cell.from_mapping({**e.twice, "model": e.model})
    except KeyError:
        return None


def _with_unfinished(part: LogDir, summary: Mapping[str, Any]) -> LogDir:
    """A shard as read, plus the cells its own summary says did not finish that have no log
    of theirs in it (a shard stopped or killed before their eval began, or still running):
    they are the merged run's missing cells, so a gate does not pass on part of the run."""
    status = summary.get("status")
    unfinished = summary.get("missing")
    if status == "complete" or not isinstance(unfinished, list):
        return part
    logged = {_cell_of(e) for e in part.current}
    extra = []
    for m in unfinished:
        if not isinstance(m, Mapping):
            continue
        cell = Cell.from_mapping({k: m.get(k) for k in CELL})
        if cell not in logged:
            extra.append(f"cell {cell.label} of {name_of(part.root)} ({status})")
    return replace(part, missing=part.missing + tuple(extra))


def _require_disjoint(parts: list[LogDir], root: Location) -> None:
    """Refuse shards that both hold a log of one cell (shards of different suites, one of
    them written by a twice that did not record its suite): the cell would count twice."""
    clash = _first_clash((e, part.root) for part in parts for e in part.current)
    if clash is not None:
        cell, first, second = clash
        raise LogReadError(
            f"log directory {str(root)!r} holds cell {cell} in two shards "
            f"({name_of(first)}, {name_of(second)}): the shards come from "
            "different suites. Rerun the stale shards with the same suite, or move "
            "them elsewhere"
        )


def _require_one_log_per_cell(current: Iterable[LogEntry], root: Location) -> None:
    """Refuse two counted logs of one cell in one directory: the logs of two runs put
    together (copied, or a directory without inspect's ``eval-set.json``) would count the
    same trials (sample × epoch) twice, and narrow every interval as if they were new."""
    clash = _first_clash((e, e.path) for e in current)
    if clash is not None:
        cell, first, second = clash
        raise LogReadError(
            f"log directory {str(root)!r} holds two logs of cell {cell} ({name_of(first)}, "
            f"{name_of(second)}), from two runs: their trials would be counted twice. Keep "
            "one of them there (move the other elsewhere), or rerun `twice run` into a new "
            "--log-dir"
        )


def _first_clash(
    entries: Iterable[tuple[LogEntry, Location]],
) -> tuple[str, Location, Location] | None:
    """The first cell that two different origins (shards, or log files) both hold:
    ``(cell label, first origin, second origin)``."""
    seen: dict[Cell, Location] = {}
    for e, origin in entries:
        cell = _cell_of(e)
        if cell is None:
            continue
        if cell in seen and seen[cell] != origin:
            return cell.label, seen[cell], origin
        seen[cell] = origin
    return None


def _has_logs(root: Location) -> bool:
    return any(_is_log(p) for p in list_files(root))


def _read_one(root: Location, *, allow_empty: bool) -> LogDir:
    if allow_empty and not _has_logs(root):
        # A shard dealt no cells (more shards than cells) or one that never started: the
        # latter's planned tasks, if any were recorded, show up as missing.
        return LogDir(root, (), (), tuple((_planned(root) or {}).values()))
    entries = [_entry(p) for p in log_files(root)]
    planned = _planned(root)
    newest: dict[str, LogEntry] = {}
    for e in sorted(entries, key=lambda e: (e.created, name_of(e.path))):
        if planned is None or e.task_id in planned:
            newest[e.task_id] = e
    current = tuple(newest.values())
    _require_one_log_per_cell(current, root)
    kept = {str(e.path) for e in current}
    superseded = tuple(e for e in entries if str(e.path) not in kept)
    missing = tuple(desc for tid, desc in (planned or {}).items() if tid not in newest)
    if not current and not allow_empty:
        raise LogReadError(
            f"log directory {str(root)!r} holds no logs of the tasks in its eval-set.json; "
            "rerun `twice run` with the same --log-dir"
        )
    return LogDir(root, current, superseded, missing)


def check_log_dir(log_dir: Location) -> None:
    """Check that an existing log directory can be resumed into (every log readable).

    A directory that does not exist yet, or holds no logs, is fine.

    Raises:
        LogReadError: naming a log that cannot be read.
    """
    root = as_location(log_dir)
    if not is_dir(root):
        return
    try:
        files = log_files(root)
    except LogReadError:
        return  # no logs yet: a fresh run
    for path in files:
        _entry(path)
