"""The memory a run may use, and the refusal of a cell whose planned trials would not fit.

inspect allocates every trial of an eval it plans before any runs, so a huge ``--epochs``
fails long after it was typed, by the OOM killer; twice refuses it before it starts.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from ..suite import SuiteError

BYTES_PER_PLANNED_TRIAL = 6_000
"""What inspect holds for each trial of an eval it plans, before any runs (every sample ×
epoch is allocated up front): 300,000 epochs of one sample took 1.8 GB."""


PROC_SELF_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_MEMORY_FILES = (
    f"{CGROUP_ROOT}/memory.max",  # cgroup v2: "max" or bytes
    f"{CGROUP_ROOT}/memory/memory.limit_in_bytes",  # cgroup v1: a huge number when unset
)
"""Where a container's memory limit is read (the process's own cgroup, as mounted in it)."""


def _own_cgroup_files() -> list[str]:
    """The memory limit files of this process's own cgroup and of each cgroup above it
    (a limit on a parent binds too): without a cgroup namespace, the mount's root files
    are the host's, not the container's."""
    try:
        lines = Path(PROC_SELF_CGROUP).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    out = []
    for line in lines:
        _id, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":  # cgroup v2: one unified hierarchy
            base, name = CGROUP_ROOT, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = f"{CGROUP_ROOT}/memory", "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        out += ["/".join([base, *parts[:depth], name]) for depth in range(len(parts), 0, -1)]
    return out


def memory_limit() -> tuple[int, str] | None:
    """The memory this process may use and what sets it: the machine's physical memory, or
    a lower limit of its container (cgroup) or of ``ulimit -v``. None when none is known."""
    limits: list[tuple[int, str]] = []
    with contextlib.suppress(AttributeError, ValueError, OSError):  # not on every platform
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        limits.append((physical, "this machine's"))
    for path in (*CGROUP_MEMORY_FILES, *_own_cgroup_files()):
        try:
            text = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit():
            limits.append((int(text), "this container's (cgroup limit)"))
    with contextlib.suppress(ImportError, ValueError, OSError):  # no resource on Windows
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            limits.append((soft, "this process's (ulimit -v)"))
    return min(limits) if limits else None


def _size(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.0f} MB"


def check_memory(cells: Sequence[tuple[str, int]], epochs: int) -> None:
    """Refuse a cell whose planned trials alone would take more than half the memory this
    process may use: ``cells`` are ``(task name, samples per epoch)``. Without the check,
    ``--epochs 1000000000`` grows until the OOM killer ends it, ignoring Ctrl-C.

    Raises:
        SuiteError: naming the cell, its trials, their memory and the limit.
    """
    limit = memory_limit()
    if limit is None:  # not on this platform: nothing to check
        return
    memory, whose = limit
    for name, samples in cells:
        trials = samples * epochs
        if trials * BYTES_PER_PLANNED_TRIAL > memory / 2:
            raise SuiteError(
                f"{trials:,} trials in one cell ({name}: --epochs {epochs:,}) would "
                f"take about {_size(trials * BYTES_PER_PLANNED_TRIAL)} before the first "
                f"ran (inspect plans every trial up front), over half of {whose} memory, "
                f"{_size(memory)}: use fewer --epochs (or a --limit)"
            )
