"""Logs → one tidy frame (a row per trial) → per-cell rates with intervals → summary/report.

``reports`` reads only inspect logs: it imports nothing from the rest of twice.
"""

from ._aggregate import RATES, cells, summary, wilson, write_summary
from ._html import render_report, report_data, write_report
from ._frame import CELL, METRICS, LogReadError, log_files, tidy, trials_frame

__all__ = [
    "CELL",
    "METRICS",
    "RATES",
    "LogReadError",
    "cells",
    "log_files",
    "render_report",
    "report_data",
    "summary",
    "tidy",
    "trials_frame",
    "wilson",
    "write_report",
    "write_summary",
]
