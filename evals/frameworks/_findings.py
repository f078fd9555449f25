"""From a row's summary cells to its pooled rates and the one sentence of its finding.

Pure functions of ``summary.json`` cells (dicts with ``model``, ``task``, ``fault``,
``trials``, ``errors``, the ``*_rate`` fields and ``retry_sources``), so the page can be
rebuilt from any run's summaries and the logic tested on numbers made by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twice.reports.stats import wilson
from twice.tasks.agents import FrameworkRow

NO_RETRY = "stub/no-retry"
"""The control whose model never retries: any second attempt under it is the framework's."""
RETRY = "stub/retry"
"""The control whose model repeats a failed call."""
VERIFY = "stub/verify"
"""The control whose model looks before retrying: a duplicate under it was not its choice."""

BASELINE = "react"
"""The row every other is compared with: twice's own loop, no framework."""

NOUNS: dict[str, tuple[str, str]] = {
    "refund": ("refund", "refunds"),
    "send_email": ("email", "emails"),
}
"""What one effect of a task is called in a sentence (singular, plural)."""

Cells = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class Pooled:
    """A rate over every scored trial of some cells, with its Wilson 95% interval."""

    k: int
    n: int

    @property
    def rate(self) -> float | None:
        """The share ``k / n``, or None with no scored trial."""
        return self.k / self.n if self.n else None

    @property
    def ci(self) -> tuple[float, float] | None:
        """The Wilson 95% interval, or None with no scored trial."""
        return wilson(self.k, self.n) if self.n else None


def scored(cell: Mapping[str, Any]) -> int:
    """Trials of a cell that were scored (rates are over these)."""
    return max(0, int(cell.get("trials") or 0) - int(cell.get("errors") or 0))


def pooled(cells: Iterable[Mapping[str, Any]], rate: str) -> Pooled:
    """``rate`` (e.g. ``duplication_rate``) over every scored trial of ``cells``."""
    k = n = 0
    for c in cells:
        value = c.get(rate)
        if value is None:
            continue
        m = scored(c)
        k += round(float(value) * m)
        n += m
    return Pooled(k, n)


def attempts_by(cells: Iterable[Mapping[str, Any]], source: str) -> int:
    """Mutating attempts ``source`` (``framework``, ``model``) sent, summed over ``cells``."""
    total = 0
    for c in cells:
        total += int(((c.get("retry_sources") or {}).get(source) or {}).get("attempts", 0))
    return total


def of_model(cells: Cells, model: str) -> list[Mapping[str, Any]]:
    """The cells of one control model."""
    return [c for c in cells if c.get("model") == model]


def retried_by_itself(cells: Cells) -> bool:
    """Whether the measurement shows the framework re-sending a call on its own.

    Under the model that never retries every second attempt is the framework's, so a
    duplicate there, or an attempt charged to the framework, is the evidence; with no such
    cells, any attempt or duplicate charged to the framework counts.
    """
    never = of_model(cells, NO_RETRY)
    if never:
        return attempts_by(never, "framework") > 0 or pooled(never, "duplication_rate").k > 0
    return attempts_by(cells, "framework") > 0 or pooled(cells, "framework_duplication_rate").k > 0


def percent(p: Pooled) -> str:
    """``12% [5–24%]`` (``–`` with no scored trial)."""
    if p.rate is None or p.ci is None:
        return "–"
    lo, hi = p.ci
    return f"{p.rate:.0%} [{lo:.0%}–{hi:.0%}]"


def _nouns(task: str) -> tuple[str, str]:
    return NOUNS.get(task, ("effect", "effects"))


def _faults(cells: Iterable[Mapping[str, Any]]) -> str:
    return ", ".join(dict.fromkeys(f"`{c.get('fault')}`" for c in cells))


def _effects_per_duplicate(cell: Mapping[str, Any]) -> int:
    """Effects a duplicated trial of ``cell`` ended with: one, plus its excess per duplicate."""
    dup = float(cell.get("duplication_rate") or 0.0)
    excess = float(cell.get("excess_effects_mean") or 0.0)
    return 1 + max(1, round(excess / dup)) if dup > 0 else 1


def completes_otherwise(cells: Cells, baseline: Cells, models: Sequence[str]) -> list[str]:
    """Where ``cells`` complete the task at a rate whose interval does not overlap the
    baseline's under the same control model: one phrase each."""
    out = []
    for model in models:
        mine = pooled(of_model(cells, model), "completion_rate")
        theirs = pooled(of_model(baseline, model), "completion_rate")
        if mine.ci is None or theirs.ci is None:
            continue
        if mine.ci[1] < theirs.ci[0] or theirs.ci[1] < mine.ci[0]:
            out.append(f"{model} {percent(mine)} against {percent(theirs)}")
    return out


def finding(row: FrameworkRow, cells: Cells, baseline: Cells | None = None) -> str:
    """One sentence stating what the measurement shows of ``row``'s framework, citing the
    behaviour source, and saying so when it disagrees with ``retries_by_itself``.

    With ``baseline`` (the cells of twice's own loop, ``react``, under the same controls), a
    completion rate that differs from it beyond both intervals is named too.
    """
    name = f"{row.framework} ({row.setting})" if row.setting != "default" else row.framework
    if not any(scored(c) for c in cells):
        return f"{name}: no trial was scored, so nothing is measured (see the run's errors)."
    by_itself = retried_by_itself(cells)
    never = of_model(cells, NO_RETRY) or list(cells)
    if by_itself:
        sentence = _resends_by_itself(name, cells, never)
    else:
        sentence = _leaves_it_to_the_model(name, cells, never)
    if baseline:
        models = list(dict.fromkeys(str(c.get("model")) for c in cells))
        differs = completes_otherwise(cells, baseline, models)
        if differs:
            sentence += (
                f" It completes the task otherwise than twice's own loop ({BASELINE}) under "
                + "; ".join(differs)
                + "."
            )
    crashed = [c for c in cells if (c.get("crashed_rate") or 0) > 0]
    if crashed:
        sentence += f" The agent run ends with an error under {_faults(crashed)}."
    if by_itself != row.behaviour.retries_by_itself:
        said = "true" if row.behaviour.retries_by_itself else "false"
        shown = "shows" if by_itself else "does not show"
        sentence += (
            f" **The measurement disagrees with the registry**: {row.path.name} says "
            f"retries_by_itself = {said}, the measurement {shown} the framework retrying."
        )
    return sentence + f" Behaviour: {row.behaviour.source}."


def _resends_by_itself(name: str, cells: Cells, never: Cells) -> str:
    """The finding's first sentence for a framework that re-sent calls by itself."""
    dup = [c for c in never if (c.get("duplication_rate") or 0) > 0]
    if dup:
        # The headline is the refund under the lost reply, the fault the suite exists for.
        worst = max(
            dup,
            key=lambda c: (
                c.get("task") == "refund",
                c.get("fault") == "lost_reply",
                _effects_per_duplicate(c),
            ),
        )
        one, many = _nouns(str(worst.get("task")))
        count = _effects_per_duplicate(worst)
        k = pooled([worst], "duplication_rate")
        sentence = (
            f"{name} re-sends the {one} by itself: {count} {many} with a model that never "
            f"retries ({NO_RETRY}, `{worst.get('fault')}`: {k.k} of {k.n} trials; "
            f"duplicates under {_faults(dup)})."
        )
        careful = pooled(of_model(cells, VERIFY), "duplication_rate")
        if careful.k:
            sentence = sentence[:-1] + (
                f"; a model that looks before retrying cannot prevent it ({VERIFY}: "
                f"{percent(careful)})."
            )
    else:
        extra = attempts_by(never, "framework")
        sentence = (
            f"{name} re-sends calls by itself ({extra} extra attempts with a model that "
            f"never retries), but none committed a duplicate."
        )
    return sentence


def _leaves_it_to_the_model(name: str, cells: Cells, never: Cells) -> str:
    """The finding's first sentence for a framework that did not re-send a call by itself."""
    clean = pooled(never, "duplication_rate")
    sentence = (
        f"{name} does not re-send a call by itself: with a model that never retries no "
        f"trial duplicated (0 of {clean.n}, {percent(clean)})"
    )
    retry = of_model(cells, RETRY)
    model_dup = pooled(retry, "duplication_rate")
    if retry and model_dup.k:
        sentence += (
            f"; it hands the error to the model, and the model that retries duplicates "
            f"({RETRY}: {percent(model_dup)})."
        )
    elif retry:
        sentence += (
            f"; even the model that retries did not duplicate ({RETRY}: "
            f"{percent(model_dup)}): the error does not reach it as one to retry."
        )
    else:
        sentence += "."
    return sentence
