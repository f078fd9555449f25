"""The HTML report: one self-contained, autoescaped page built from the trial frame.

:func:`report_data` turns frames into plain data (lists, dicts, strings, numbers); the jinja
template only lays it out. Nothing model-controlled is marked safe anywhere: prompts, tool
arguments, tool outputs, ids and error messages all go through jinja's autoescaping, and the
page carries a Content-Security-Policy that allows no script and no network at all.

The sections are built by their own modules: what was run (``_html_run``), the rates
(``_html_rates``), the comparisons (``_html_compare``), what did not score cleanly or finish
(``_html_status``); ``_html_text`` writes the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jinja2
import pandas as pd

from ._charts import PALETTE
from ._drill import WORST_N, drill_down
from ._frame import CELL
from ._html_compare import baseline_section, callout, prompt_section
from ._html_rates import breakdowns, charts, grids, headline, sources, takeaway
from ._html_run import agents_as_models, run_info
from ._html_status import (
    agent_crashes,
    errors,
    parsing,
    partial_note,
    qualify_takeaway,
)
from ._html_text import ci_text, is_nan, p_text, pct, pct_pair, pts, pts_ci, show_bidi_controls
from ._storage import Location, as_location, write_text

# The report's entry points, and the text helpers its tests reach through this module.
__all__ = [
    "TEMPLATE",
    "callout",
    "pct",
    "pct_pair",
    "prepare_report",
    "render_report",
    "report_data",
    "write_report",
]

TEMPLATE = "report.html.j2"


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader(__package__ or "twice.reports", "templates"),
    autoescape=True,  # model-controlled text (prompts, tool args, outputs, errors) is untrusted
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    finalize=show_bidi_controls,
)


_ENV.filters.update(pct=pct, pct_pair=pct_pair, ci=ci_text, pts=pts, pts_ci=pts_ci, p=p_text)
_ENV.tests["nan"] = is_nan


def report_data(
    trials: pd.DataFrame,
    run: dict[str, Any] | None = None,
    baseline: pd.DataFrame | None = None,
    worst: int = WORST_N,
) -> dict[str, Any]:
    """Plain data for the template (no pandas objects cross into jinja).

    Args:
        trials: The trial frame (:func:`reports.trials_frame`).
        run: What was run (``evals``' run metadata); missing parts are read from the logs.
        baseline: Another run's trial frame to compare against, cell by cell.
        worst: How many of the worst trials to drill into (each is read back from its log).
    """
    crashes = agent_crashes(trials) if len(trials) and "agent" in trials else []
    trials = agents_as_models(trials)
    if baseline is not None:
        baseline = agents_as_models(baseline)
    info = run_info(trials, run)
    n_scored = int(trials["completed"].notna().sum()) if len(trials) else 0
    data: dict[str, Any] = {
        "run": info,
        "n_trials": len(trials),
        "n_scored": n_scored,
        "n_cells": len(trials[list(CELL)].drop_duplicates()) if len(trials) else 0,
        "headline": headline(trials, info) if len(trials) else [],
        "takeaway": None,
        "grids": grids(trials, info) if len(trials) else [],
        "charts": charts(trials, info) if len(trials) else [],
        "prompts": prompt_section(trials, info) if len(trials) else None,
        "baseline": baseline_section(trials, baseline) if baseline is not None else None,
        "breakdowns": breakdowns(trials, info) if len(trials) else [],
        "sources": sources(trials, info) if len(trials) else None,
        "errors": errors(trials) if len(trials) else [],
        "agent_crashes": crashes,
        "parsing": parsing(trials) if len(trials) else [],
        "worst_n": worst,
        "drill": drill_down(trials, worst) if len(trials) else [],
        "palette": PALETTE,
    }
    data["takeaway"] = takeaway(data["headline"])
    # The headline table is already wide: its wrong-values column shows only when some model
    # committed wrong values (as twice run's table does); the breakdowns always show it.
    measured = [m["wrong"]["rate"] for m in data["headline"] if not is_nan(m["wrong"]["rate"])]
    data["headline_wrong"] = any(rate > 0 for rate in measured)
    data["headline_no_wrong"] = bool(measured) and not data["headline_wrong"]
    return data


def prepare_report() -> None:
    """Do now what this process's first report would otherwise start with: import the
    statistics libraries its comparisons use (``_compare``: 0.8 s) and compile its template.

    ``twice run --workers`` calls it on the core the first worker to end leaves idle, so the
    merged report, written after the last worker ends, is that much shorter.
    """
    import scipy.stats  # noqa: F401
    import statsmodels.stats.proportion  # noqa: F401

    _ENV.get_template(TEMPLATE)


def render_report(
    trials: pd.DataFrame,
    run: dict[str, Any] | None = None,
    baseline: pd.DataFrame | None = None,
    status: Mapping[str, Any] | None = None,
) -> str:
    """The report as an HTML string (``status``: see :func:`write_report`)."""
    data = report_data(trials, run, baseline)
    qualify_takeaway(data["takeaway"], status)
    return _ENV.get_template(TEMPLATE).render(**data, partial=partial_note(status))


def write_report(
    trials: pd.DataFrame,
    path: Location,
    run: dict[str, Any] | None = None,
    baseline: pd.DataFrame | None = None,
    status: Mapping[str, Any] | None = None,
) -> Location:
    """Write the report to ``path`` and return it.

    Args:
        trials: The trial frame of the run (:func:`reports.trials_frame`).
        path: Where to write the HTML file (one self-contained file); may be an fsspec URI.
        run: What was run (models, prompts with texts, axes, versions, date), as ``evals``
            records it; anything missing is read from the logs.
        baseline: The trial frame of an earlier run: cells are compared and regressions and
            improvements flagged.
        status: The run's state as ``summary.json`` records it (``complete``, ``status``,
            ``interrupted``, ``missing``, ``missing_logs``, ``errored``, ``cut_short``): a
            report of part of a run says so above everything else.
    """
    out = as_location(path)
    write_text(out, render_report(trials, run, baseline, status))
    return out
