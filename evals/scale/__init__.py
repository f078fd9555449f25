"""Scale: a suite's shards as local worker processes (``twice run --workers N``), each given
its plan, and the merge of shard directories into one run."""

from ..suite import usable_cpus
from ._hand_off import load_records, save_records
from ._plan import WorkerPlan
from ._processes import FORK_ENV, MIN_CELLS_PER_WORKER, default_workers
from ._workers import mark_unmerged, merge, read_run, run_parallel

__all__ = [
    "FORK_ENV",
    "MIN_CELLS_PER_WORKER",
    "WorkerPlan",
    "default_workers",
    "load_records",
    "mark_unmerged",
    "merge",
    "read_run",
    "run_parallel",
    "save_records",
    "usable_cpus",
]
