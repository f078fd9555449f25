"""Logs → one tidy frame (a row per trial) → per-cell rates with intervals → summary/report.

``reports`` reads only inspect logs: it imports nothing from the rest of twice.
"""

from ._aggregate import RATES, cells, summary, wilson, write_summary
from ._compare import COMPARED, Difference, baseline_comparison, difference, prompt_comparison
from ._drill import WORST_N, drill_down, severity, trial_detail, worst_trials
from ._frame import (
    CELL,
    LEDGER_COLUMNS,
    METRICS,
    RETRY_SOURCES,
    LogReadError,
    ledger_counts,
    log_files,
    tidy,
    trials_frame,
)
from ._html import render_report, report_data, write_report
from ._storage import (
    Location,
    as_location,
    find_files,
    is_dir,
    is_file,
    is_remote,
    join,
    list_dir,
    make_dirs,
    name_of,
    open_binary,
    parent_of,
    read_text,
    write_text,
)
from ._synthetic import SyntheticCell, SyntheticRun, write_synthetic_logs

__all__ = [
    "CELL",
    "COMPARED",
    "LEDGER_COLUMNS",
    "METRICS",
    "RATES",
    "RETRY_SOURCES",
    "WORST_N",
    "Difference",
    "Location",
    "LogReadError",
    "SyntheticCell",
    "SyntheticRun",
    "as_location",
    "baseline_comparison",
    "cells",
    "difference",
    "drill_down",
    "find_files",
    "is_dir",
    "is_file",
    "is_remote",
    "join",
    "ledger_counts",
    "list_dir",
    "log_files",
    "make_dirs",
    "name_of",
    "open_binary",
    "parent_of",
    "prompt_comparison",
    "read_text",
    "render_report",
    "report_data",
    "severity",
    "summary",
    "tidy",
    "trial_detail",
    "trials_frame",
    "wilson",
    "worst_trials",
    "write_report",
    "write_summary",
    "write_synthetic_logs",
    "write_text",
]
