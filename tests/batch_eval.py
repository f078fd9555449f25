"""inspect's ``eval`` as ``twice run`` calls it, for the tests that run tasks in-process.

A test of what a task, an agent or a scorer does runs inspect's ``eval`` on the tasks it
builds. :func:`batch_eval` runs it with the options a suite run uses
(:func:`twice.evals.run.eval_options`: no live sample buffer, no control server), the results
table a quiet console discards left unrendered, and the git revision each log records asked
once per call instead of once per task. None of them changes a trial, a score or what a log
holds of its samples. Together they save about a tenth of those tests' CPU (75 s before, 63
and 69 s after, the nine files in one process).
"""

from __future__ import annotations

from typing import Any

from inspect_ai import eval as inspect_eval
from inspect_ai.log import EvalLog
from twice.evals.run import eval_options, no_results_table
from twice.evals.run._speedups import revision_resolved_once


def batch_eval(tasks: Any, **kwargs: Any) -> list[EvalLog]:
    """``inspect_ai.eval(tasks, **kwargs)`` with a suite run's options (``display="none"``
    unless given); an argument given here wins."""
    options = {**eval_options("none"), "display": "none", **kwargs}
    with no_results_table(options["display"]), revision_resolved_once():
        return inspect_eval(tasks, **options)
