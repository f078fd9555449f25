"""Logs → one tidy frame (a row per trial) → per-cell rates with intervals → summary/report.

``reports`` reads only inspect logs: it imports nothing from the rest of twice.
"""

from ._aggregate import cells, summary, wilson, write_summary
from ._compare import (
    BaselineTest,
    Difference,
    baseline_comparison,
    baseline_test,
    difference,
    prompt_comparison,
)
from ._drill import WORST_N, drill_down, severity, trial_detail, worst_trials
from ._frame import (
    CELL,
    LEDGER_COLUMNS,
    METRICS,
    PARSE_COLUMNS,
    PARSE_SHAPES,
    RETRY_SOURCES,
    ledger_counts,
    parse_counts,
    tidy,
    trials_frame,
)
from ._html import render_report, report_data, write_report
from ._logs import LogDir, LogEntry, LogReadError, check_log_dir, log_files, read_log_dir
from ._metrics import CATALOGUE, COMPARED, Metric, crashed, metric
from ._passk import no_dup_k

__all__ = [
    "CATALOGUE",
    "CELL",
    "COMPARED",
    "LEDGER_COLUMNS",
    "METRICS",
    "PARSE_COLUMNS",
    "PARSE_SHAPES",
    "RETRY_SOURCES",
    "WORST_N",
    "BaselineTest",
    "Difference",
    "LogDir",
    "LogEntry",
    "LogReadError",
    "Metric",
    "baseline_comparison",
    "baseline_test",
    "cells",
    "check_log_dir",
    "crashed",
    "difference",
    "drill_down",
    "ledger_counts",
    "log_files",
    "metric",
    "no_dup_k",
    "parse_counts",
    "prompt_comparison",
    "read_log_dir",
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
]
