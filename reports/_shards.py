"""Shard directories of a log directory: ``LOG_DIR/shard-i-of-n/``, found and checked.

``twice run --shard i/n`` writes one; ``twice report`` and ``twice gate`` merge them. Only
directory listing lives here (reports reads logs); how cells are dealt to shards is in
``twice.evals``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._storage import (
    Location,
    LogReadError,
    as_location,
    is_dir,
    is_file,
    join,
    list_dir,
    name_of,
    read_text,
)

SHARD_DIR = re.compile(r"^shard-(\d+)-of-(\d+)$")
"""Name of a shard's log directory inside ``LOG_DIR``."""

MAX_SHARDS = 10_000
"""The most shards a run may be split into (``twice run --shard`` refuses more, and a log
directory holding more is refused before its ``1..n`` is listed: 10**20 took forever)."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    @property
    def name(self) -> str:
        """The shard's directory name, ``shard-i-of-n``."""
        return f"shard-{self.index}-of-{self.count}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class ShardSet:
    """The shard directories found in a log directory."""

    count: int
    dirs: dict[int, Location]
    """Shard index → its directory, for the shards present."""

    @property
    def missing(self) -> list[Shard]:
        """The shards of ``1..count`` that have no directory."""
        return [Shard(i, self.count) for i in range(1, self.count + 1) if i not in self.dirs]

    def record(self) -> dict[str, Any]:
        """What ``summary.json`` records about the merged shards."""
        return {"count": self.count, "dirs": [name_of(self.dirs[i]) for i in sorted(self.dirs)]}


def find_shards(log_dir: Location) -> ShardSet | None:
    """The ``shard-i-of-n`` directories of ``log_dir``; None when it holds none.

    Raises:
        LogReadError: when the directory mixes shard counts (``-of-2`` beside ``-of-3``).
    """
    root = as_location(log_dir)
    if not is_dir(root):
        return None
    found: dict[int, dict[int, Location]] = {}
    for child in list_dir(root):
        m = SHARD_DIR.match(name_of(child))
        if m and is_dir(child):
            found.setdefault(int(m[2]), {})[int(m[1])] = child
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(f"-of-{n}" for n in sorted(found))
        raise LogReadError(
            f"log directory {str(root)!r} mixes shard counts ({names}); a run is split one way: "
            "move the shard directories of the other split elsewhere"
        )
    ((count, dirs),) = found.items()
    if count > MAX_SHARDS:
        raise LogReadError(
            f"log directory {str(root)!r} holds shards of {count} (shard-i-of-{count}); a run "
            f"is split into at most {MAX_SHARDS}: move that directory elsewhere"
        )
    return ShardSet(count, dirs)


def read_summary(log_dir: Location, warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``LOG_DIR/summary.json``; empty (after ``warn``) when missing or unreadable."""
    path = join(log_dir, "summary.json")
    if not is_file(path):
        return {}
    try:
        summary = json.loads(read_text(path))
    except ValueError as ex:
        if warn:
            warn(f"ignoring unreadable {path}: {ex}")
        return {}
    return summary if isinstance(summary, dict) else {}


def shard_summaries(shards: ShardSet) -> dict[int, dict[str, Any]]:
    """Each present shard's own ``summary.json`` (empty when it has none or it is unreadable).
    Every shard run writes one as it starts, even a shard dealt no cells."""
    return {i: read_summary(d) for i, d in sorted(shards.dirs.items())}


def require_complete(
    shards: ShardSet, log_dir: Location, summaries: dict[int, dict[str, Any]] | None = None
) -> None:
    """Refuse a merge with a shard missing (its cells would silently be absent): no directory,
    or a directory that holds nothing of a run (no summary, no ``eval-set.json``, no log: a
    shard job that failed before it began, leaving an empty artifact).

    Raises:
        LogReadError: naming every missing shard and the command that produces it.
    """
    summaries = shard_summaries(shards) if summaries is None else summaries
    empty = [i for i, d in shards.dirs.items() if not summaries.get(i) and not _began(d)]
    missing = sorted(
        [*shards.missing, *(Shard(i, shards.count) for i in empty)], key=lambda m: m.index
    )
    if missing:
        shown = 10  # a million-shard typo must not print a 25 MB line
        names = ", ".join(m.name for m in missing[:shown])
        names += f", ... ({len(missing) - shown} more)" if len(missing) > shown else ""
        raise LogReadError(
            f"log directory {str(log_dir)!r} is missing {len(missing)} of {shards.count} "
            f"shard(s): {names}; run `twice run --shard {missing[0]} --log-dir {log_dir}` "
            "(same suite) for each, then report or gate again"
        )


def _began(shard_dir: Location) -> bool:
    return any(
        name_of(p) == "eval-set.json" or name_of(p).endswith(".eval") for p in list_dir(shard_dir)
    )


def require_one_suite(
    shards: ShardSet, log_dir: Location, summaries: dict[int, dict[str, Any]] | None = None
) -> None:
    """Refuse a merge of shards that ran different suites (another suite, epochs, limit or
    model args, e.g. a cluster shard rerun with changed flags): cells dealt differently
    would be counted twice or lost. Each shard's ``summary.json`` names its suite
    (``run.shard.suite``; a summary from an older twice names none and is not checked here,
    though a cell found in two shards still is: ``read_log_dir``). A shard that holds logs
    but no readable ``summary.json`` (deleted, truncated, left out of an artifact) is
    refused: its suite cannot be checked, and another suite's cells would be counted as
    this one's.

    Raises:
        LogReadError: naming the shards of each suite, or the shards whose suite is unknown.
    """
    summaries = shard_summaries(shards) if summaries is None else summaries
    unknown = [
        _without_summary(d)
        for i, d in sorted(shards.dirs.items())
        if not summaries.get(i) and _began(d)
    ]
    if unknown:
        raise LogReadError(
            f"log directory {str(log_dir)!r} has logs in {', '.join(unknown)}: a shard's "
            "summary.json names the suite it ran, and without it another suite's cells would "
            f"be counted as this run's. Rerun it (`twice run --shard i/{shards.count} "
            f"--log-dir {log_dir}` with the run's flags: it resumes and writes its summary "
            "again), or move it elsewhere"
        )
    suites: dict[str, list[str]] = {}
    for i, summary in sorted(summaries.items()):
        digest = _suite_of(summary)
        if digest is not None:
            suites.setdefault(digest, []).append(name_of(shards.dirs[i]))
    if len(suites) > 1:
        groups = "; ".join(f"{', '.join(names)} ran suite {d[:12]}" for d, names in suites.items())
        raise LogReadError(
            f"log directory {str(log_dir)!r} holds shards of different suites ({groups}): "
            "their cells would be counted twice or lost. Rerun the stale shards with the same "
            f"suite (`twice run --shard i/{shards.count} --log-dir {log_dir}` with the same "
            "flags), or move them elsewhere"
        )


def _without_summary(shard_dir: Location) -> str:
    state = "unreadable" if is_file(join(shard_dir, "summary.json")) else "missing"
    return f"{name_of(shard_dir)} (summary.json {state})"


def _suite_of(summary: dict[str, Any]) -> str | None:
    try:
        digest = summary["run"]["shard"]["suite"]
    except (KeyError, TypeError):
        return None
    return digest if isinstance(digest, str) else None
