"""How many CPUs this process may run on: what sizes ``--workers`` and how many agent
commands run at once."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
