"""The HTML report: one self-contained, autoescaped page built from the trial frame."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from ._aggregate import cells

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("reports", "templates"),
    autoescape=True,  # model-controlled text (prompts, ids, errors) is untrusted
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def report_data(trials: pd.DataFrame, run: dict[str, Any] | None = None) -> dict[str, Any]:
    """Plain data for the template (no pandas objects cross into jinja)."""
    table = cells(trials)
    by_model = cells(trials, by=("model",))
    return {
        "run": run or {},
        "models": by_model.to_dict("records"),
        "cells": table.to_dict("records"),
        "n_trials": len(trials),
    }


def render_report(trials: pd.DataFrame, run: dict[str, Any] | None = None) -> str:
    """The report as an HTML string."""
    return _ENV.get_template("report.html.j2").render(**report_data(trials, run))


def write_report(trials: pd.DataFrame, path: str | Path, run: dict[str, Any] | None = None) -> Path:
    """Write the report to ``path`` and return it."""
    out = Path(path)
    out.write_text(render_report(trials, run), encoding="utf-8")
    return out
