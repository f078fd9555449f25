"""Shards: a deterministic share of a suite's cells per process or machine.

``twice run --shard i/n`` runs the cells dealt to shard ``i`` into ``LOG_DIR/shard-i-of-n/``.
The deal: cells are ordered by the SHA-256 of their axes (model, prompt, task, fault,
protection) and dealt round-robin, so every process and machine computes the same split from
the same suite (Python's ``hash()`` is salted per process and would not), and shard sizes
differ by at most one cell.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from twice.reports import MAX_SHARDS, Cell, Location, Shard, join

from ._suite import SuiteError


def parse_shard(text: str) -> Shard:
    """``"2/3"`` → ``Shard(2, 3)``.

    Raises:
        SuiteError: unless the text is ``i/n`` with ``1 <= i <= n``.
    """
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if m and int(m[2]) > MAX_SHARDS:
        raise SuiteError(
            f"--shard {text!r}: at most {MAX_SHARDS} shards (a shard beyond the suite's cell "
            "count would be empty)"
        )
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise SuiteError(
            f"--shard {text!r} is not i/n with 1 <= i <= n (e.g. 1/4 ... 4/4; in a Kubernetes "
            "Indexed Job: --shard $((JOB_COMPLETION_INDEX + 1))/N)"
        )
    return Shard(int(m[1]), int(m[2]))


def cell_digest(cell: Cell) -> str:
    """A stable hex digest of the cell's axes (the same in every process and on every machine)."""
    axes = [cell.model, cell.prompt, cell.task, cell.fault, cell.protection]
    if cell.agent != "react":  # react cells keep the digests they had before the agent axis
        axes.append(cell.agent)
    return hashlib.sha256(json.dumps(axes).encode("utf-8")).hexdigest()


def suite_digest(cells: Sequence[Cell], epochs: int, limit: int | None, model_args: Any) -> str:
    """A stable hex digest of what a sharded run runs: every cell of the whole suite, its epochs,
    limit and recorded model args. Each shard records it in its summary (``run.shard.suite``);
    ``twice report``/``gate`` refuse to merge shards that ran different suites, whose cells would
    otherwise be counted twice or lost (``twice.reports.read_log_dir``)."""
    what = {
        "cells": sorted(cell_digest(c) for c in cells),
        "epochs": epochs,
        "limit": limit,
        "model_args": model_args,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode("utf-8")).hexdigest()


def shard_cells(cells: Sequence[Cell], shard: Shard) -> list[Cell]:
    """The cells dealt to ``shard``, in suite order.

    Cells sorted by :func:`cell_digest` are dealt round-robin: the shards of one suite are
    disjoint, cover it, and differ in size by at most one cell.
    """
    ranked = sorted(range(len(cells)), key=lambda i: cell_digest(cells[i]))
    mine = {i for rank, i in enumerate(ranked) if rank % shard.count == shard.index - 1}
    return [c for i, c in enumerate(cells) if i in mine]


def shard_dir(log_dir: Location, shard: Shard) -> Location:
    """``LOG_DIR/shard-i-of-n``."""
    return join(log_dir, shard.name)
