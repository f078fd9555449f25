"""The metric catalogue: every per-cell metric twice reports, defined once.

The report, ``summary.json``, the gate and the comparisons all read these entries, so a
metric's name, the per-trial column it comes from, its label and which way is better cannot
disagree between them. The per-trial columns are the names twice's ``side_effects`` scorer
writes (``assertions.METRICS``; a test pins the two, since ``reports`` imports nothing from
the rest of twice).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import pandas as pd


@dataclass(frozen=True)
class Metric:
    """One per-cell metric.

    Attributes:
        name: Its ``summary.json`` key and gate name (``duplication_rate``).
        column: The per-trial column it averages (``duplicated``).
        label: How the report names it (``duplication``).
        better: ``lower`` or ``higher``: which way is an improvement.
        kind: ``rate`` (a share of trials, with a Wilson interval ``<prefix>_ci``) or ``mean``
            (a per-trial mean, without an interval).
        what: What it counts, in one phrase.
    """

    name: str
    column: str
    label: str
    better: Literal["lower", "higher"]
    kind: Literal["rate", "mean"]
    what: str

    @property
    def higher_is_worse(self) -> bool:
        """Whether a larger value is a regression."""
        return self.better == "lower"

    @property
    def prefix(self) -> str:
        """``duplication`` for ``duplication_rate``: the stem of its ``_rate``/``_ci`` keys."""
        return self.name.removesuffix("_rate").removesuffix("_mean")

    @property
    def ci(self) -> str | None:
        """The key of its interval (``duplication_ci``), None for a mean."""
        return f"{self.prefix}_ci" if self.kind == "rate" else None


CATALOGUE: tuple[Metric, ...] = (
    Metric(
        "completion_rate",
        "completed",
        "completion",
        "higher",
        "rate",
        "trials where everything asked for was done",
    ),
    Metric(
        "duplication_rate",
        "duplicated",
        "duplication",
        "lower",
        "rate",
        "trials where some intent got more effects than asked",
    ),
    Metric(
        "exactly_once_rate",
        "exactly_once",
        "exactly once",
        "higher",
        "rate",
        "trials where every intent got exactly its expected count and nothing else happened",
    ),
    Metric(
        "safe_success_rate",
        "safe_success",
        "safe success",
        "higher",
        "rate",
        "completed and exactly once: the job got done, once",
    ),
    Metric(
        "divergence_rate",
        "diverged",
        "divergence",
        "lower",
        "rate",
        "trials where two effects of one intent differ in a non-identity field",
    ),
    Metric(
        "wrong_rate",
        "wrong",
        "wrong values",
        "lower",
        "rate",
        "trials where an effect's values differ from the ones asked for (asked $4.99, "
        "refunded $39.97)",
    ),
    Metric(
        "excess_effects_mean",
        "excess_effects",
        "excess effects / trial",
        "lower",
        "mean",
        "effects beyond what each intent expects, plus effects matching no intent",
    ),
    Metric(
        "wrong_effects_mean",
        "wrong_effects",
        "wrong effects / trial",
        "lower",
        "mean",
        "effects whose values differ from the ones their intent asked for",
    ),
    Metric(
        "unseen_effects_mean",
        "unseen_effects",
        "unseen effects / trial",
        "lower",
        "mean",
        "effects whose id never appeared in a tool result the agent saw",
    ),
)
"""Every per-cell metric, in ``summary.json`` order."""

AGENT_CRASHED = Metric(
    "crashed_rate",
    "crashed",
    "agent crashed",
    "lower",
    "rate",
    "trials whose agent under test raised (each still scored from its ledger)",
)
"""A per-cell rate outside :data:`CATALOGUE`, whose columns are the side-effects scorer's
own: ``crashed`` comes from the trial's store, where a framework agent that raised (a
``ReadTimeout`` on a lost reply, say) is recorded. Such a trial can still count as completed
and not duplicated, so only this rate shows the crash to a gate. 0 for twice's own agent
loop, which does not crash."""

GATEABLE: tuple[Metric, ...] = (*CATALOGUE, AGENT_CRASHED)
"""Every metric ``summary.json`` gives per cell with a value a gate rule can bound."""

COMPARED: tuple[str, ...] = ("duplication_rate", "safe_success_rate", "completion_rate")
"""The rates compared between prompts, against a baseline run, and (by default) by the gate's
``[baseline]`` check, in the order the report shows them."""


def metric(name: str) -> Metric:
    """The metric named ``name`` (its summary key, e.g. ``duplication_rate``), or the one
    computed from the per-trial column ``name`` (``duplicated``), among :data:`GATEABLE`.

    Raises:
        KeyError: naming the metrics there are.
    """
    for m in GATEABLE:
        if name in (m.name, m.column):
            return m
    raise KeyError(f"unknown metric {name!r}; expected one of: {', '.join(metric_names())}")


def metric_names(kind: Literal["rate", "mean"] | None = None) -> list[str]:
    """The names of the metrics a gate can bound (:data:`GATEABLE`), optionally only the
    rates or only the means."""
    return [m.name for m in GATEABLE if kind is None or m.kind == kind]


def errored(trials: pd.DataFrame) -> pd.Series:
    """Which trials errored: an error was recorded, or the trial was never scored.

    The one definition of "errored trial" behind ``errors`` in ``summary.json``, the gate's
    refusal to gate on partial results, the report's list of errored trials and the
    drill-down severity. Not the ``crashed`` column, which says an agent under test raised
    (a finding about the agent, in a trial that was scored).
    """
    return (trials["error"] != "") | trials["completed"].isna()


def crashed(trials: pd.DataFrame) -> pd.Series:
    """Deprecated name of :func:`errored` (which trials errored).

    "Crashed" is the word for an agent under test that raised (the ``crashed`` column).

    Warns:
        DeprecationWarning: always; call :func:`errored`.
    """
    warnings.warn(
        "twice.reports.crashed() is deprecated: it selects errored trials, so call "
        "twice.reports.errored(); 'crashed' is the column of agents under test that raised",
        DeprecationWarning,
        stacklevel=2,
    )
    return errored(trials)
