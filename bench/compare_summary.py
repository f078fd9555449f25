"""Compare two ``summary.json`` files, ignoring what differs between any two runs.

Versions (``run.versions``), timestamps (``created``) and paths (any absolute path is
compared by its last component) are left out; everything else (every cell, rate, interval,
count and run setting, in order) must be equal. Exits 0 when they are, 1 with the first
differences listed, 2 for a file that cannot be read.

    python bench/compare_summary.py BEFORE/summary.json AFTER/summary.json [--shards]

``--shards`` also compares each ``shard-i-of-n/summary.json`` beside the two files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path, PurePath
from typing import Any

IGNORED_KEYS = {"versions", "created"}
"""Keys whose values differ between any two runs of the same code and data."""


def normal(value: Any) -> Any:
    """``value`` without the ignored keys, each absolute path as its last component."""
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items() if k not in IGNORED_KEYS}
    if isinstance(value, list):
        return [normal(v) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        return PurePath(value).name
    return value


def differences(before: Any, after: Any, where: str = "") -> list[str]:
    """Each place where the two normalised values differ, as ``path: before != after``."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = [f"{where}.{k}: only before" for k in before if k not in after]
        out += [f"{where}.{k}: only after" for k in after if k not in before]
        if list(k for k in before if k in after) != list(k for k in after if k in before):
            out.append(f"{where}: keys in another order")
        for k in before:
            if k in after:
                out += differences(before[k], after[k], f"{where}.{k}")
        return out
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return [f"{where}: {len(before)} items != {len(after)}"]
        return [
            d
            for i, (b, a) in enumerate(zip(before, after, strict=True))
            for d in differences(b, a, f"{where}[{i}]")
        ]
    return [] if before == after else [f"{where}: {before!r} != {after!r}"]


def compare(before: Path, after: Path) -> list[str]:
    """The differences between two summary files."""
    return differences(
        normal(json.loads(before.read_text())), normal(json.loads(after.read_text()))
    )


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--shards"]
    if len(args) != 2:
        print(
            "usage: compare_summary.py BEFORE/summary.json AFTER/summary.json [--shards]",
            file=sys.stderr,
        )
        return 2
    before, after = Path(args[0]), Path(args[1])
    pairs = [(before, after)]
    if "--shards" in argv:
        for shard in sorted(before.parent.glob("shard-*-of-*/summary.json")):
            pairs.append((shard, after.parent / shard.parent.name / "summary.json"))
    found = 0
    for b, a in pairs:
        try:
            diff = compare(b, a)
        except (OSError, ValueError) as ex:
            print(f"cannot compare {b} with {a}: {ex}", file=sys.stderr)
            return 2
        data = json.loads(b.read_text())
        print(f"{b} vs {a}: {len(data.get('cells', []))} cells, {len(diff)} difference(s)")
        for line in diff[:20]:
            print(f"  {line}")
        found += len(diff)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
