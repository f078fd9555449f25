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
from ._passk import no_dup_k
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
    "LogReadError",
    "SyntheticCell",
    "SyntheticRun",
    "baseline_comparison",
    "cells",
    "difference",
    "drill_down",
    "ledger_counts",
    "log_files",
    "no_dup_k",
    "prompt_comparison",
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
]
