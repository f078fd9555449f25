"""The suite: what ``twice run`` runs (models × agents × prompts × tasks × faults ×
protections), read from flags or a TOML file, and the deal of its cells into shards."""

from twice.reports import Cell

from ._cpus import usable_cpus
from ._hang import DEFAULT_HANG_SECONDS, MAX_HANG_SECONDS, check_hang_seconds
from ._load import load_suite, read_shipped, suite_from_flags
from ._shards import cell_digest, parse_shard, shard_cells, shard_dir, suite_digest
from ._suite import (
    AGENT_TIMEOUT,
    AXES,
    DEFAULT_OUTAGE_WINDOW,
    Matrix,
    Suite,
    SuiteError,
    command_agent_name,
)

__all__ = [
    "AGENT_TIMEOUT",
    "AXES",
    "DEFAULT_HANG_SECONDS",
    "DEFAULT_OUTAGE_WINDOW",
    "MAX_HANG_SECONDS",
    "Cell",
    "Matrix",
    "Suite",
    "SuiteError",
    "cell_digest",
    "check_hang_seconds",
    "command_agent_name",
    "load_suite",
    "parse_shard",
    "read_shipped",
    "shard_cells",
    "shard_dir",
    "suite_digest",
    "suite_from_flags",
    "usable_cpus",
]
