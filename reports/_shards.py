"""Shard directories of a log directory: ``LOG_DIR/shard-i-of-n/``, found and checked.

``twice run --shard i/n`` writes one; ``twice report`` and ``twice gate`` merge them. Only
directory listing lives here (reports reads logs); how cells are dealt to shards is in
``twice.evals``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ._storage import Location, LogReadError, as_location, is_dir, list_dir, name_of

SHARD_DIR = re.compile(r"^shard-(\d+)-of-(\d+)$")
"""Name of a shard's log directory inside ``LOG_DIR``."""


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
    return ShardSet(count, dirs)


def require_complete(shards: ShardSet, log_dir: Location) -> None:
    """Refuse a merge with a shard missing (its cells would silently be absent).

    Raises:
        LogReadError: naming every missing shard and the command that produces it.
    """
    missing = shards.missing
    if missing:
        names = ", ".join(m.name for m in missing)
        raise LogReadError(
            f"log directory {str(log_dir)!r} is missing {len(missing)} of {shards.count} "
            f"shard(s): {names}; run `twice run --shard {missing[0]} --log-dir {log_dir}` "
            "(same suite) for each, then report or gate again"
        )
