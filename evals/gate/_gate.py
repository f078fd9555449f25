"""The release gate: thresholds on measured rates, and regressions against a baseline.

A gate file holds ``[[rule]]`` blocks and an optional ``[baseline]`` table::

    confidence = 0.95                  # level of the Wilson interval behind "lower"/"upper"

    [[rule]]
    name = "no duplicates after a lost reply"
    metric = "duplication_rate"        # a summary.json rate (or excess_effects_mean, ...)
    max = 0.05                         # or min = 0.9 for rates that must be high
    statistic = "upper"                # "point", "lower" or "upper" (default: the cautious one)
    min_trials = 60                    # a cell with fewer scored trials fails the rule
    fault = ["lost_reply", "timeout_before_commit"]   # filters: model, agent, prompt, task,
                                                      # fault, protection (glob patterns)

    [baseline]                         # used with --baseline LOG_DIR
    alpha = 0.05
    metrics = ["duplication_rate", "completion_rate", "safe_success_rate"]
    match = ["model", "agent", "prompt", "task", "fault", "protection"]

Every rule is checked in every cell it matches (a rule × cell is one JUnit test case).

**Why Fisher's exact test for the baseline.** The test is ``reports.baseline_test``, the same
function behind the report's regression badge, so the two never disagree at one alpha. A cell
holds tens of trials and the rates that
matter sit near 0 (duplication) or 1 (completion), so the expected counts in the 2×2 table are
often below 5: there the normal approximation behind the two-proportion z-test is poor and
can exceed its nominal false-alarm rate. Fisher's exact test conditions on the margins and
computes the tail probability exactly, so its false-alarm rate never exceeds ``alpha`` at any
sample size; the price is some conservatism, which suits a release gate (a "worse" verdict
should mean it). It is one-sided because only a regression should fail a release.
"""

from __future__ import annotations

import math
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from twice.mocks import UsageError
from twice.reports import (
    AGENT_CRASHED,
    CELL,
    COMPARED,
    Cell,
    alpha_of,
    as_location,
    baseline_test,
    errored,
    is_remote,
    metric,
    metric_names,
    replace_local,
    wilson,
    write_text,
)

from ..suite import read_shipped
from ._rule import STATISTICS, Rule, Statistic
from ._sequential import describe
from ._sequential_rules import rule_state

Status = Literal["pass", "fail", "skip"]


class GateError(UsageError, ValueError):
    """A gate file that cannot be used: names the bad value and what would be accepted."""


def _is_rate(name: str) -> bool:
    return metric(name).kind == "rate"


@dataclass(frozen=True)
class BaselinePolicy:
    """How ``--baseline`` compares: which rates, which cells pair up, at what alpha."""

    alpha: float = 0.05
    metrics: tuple[str, ...] = COMPARED
    match: tuple[str, ...] = CELL
    """Cell keys that pair a cell with baseline trials; keys left out are pooled (e.g. leave
    out ``model`` to compare a new model against the old one)."""


@dataclass(frozen=True)
class GateConfig:
    """A parsed gate file."""

    rules: tuple[Rule, ...]
    confidence: float = 0.95
    baseline: BaselinePolicy = BaselinePolicy()
    source: str = "<config>"


@dataclass(frozen=True)
class Check:
    """The verdict of one rule (or baseline comparison) in one cell."""

    group: str
    """``rule`` or ``baseline``."""
    name: str
    """The rule name, or the metric compared with the baseline."""
    cell: str
    status: Status
    message: str


@dataclass
class GateResult:
    """Every check of a gate run."""

    checks: list[Check]
    notes: list[str] = field(default_factory=list)
    """Things the reader should know that are not failures (errored trials excluded...)."""

    @property
    def failures(self) -> list[Check]:
        """The failing checks."""
        return [c for c in self.checks if c.status == "fail"]

    @property
    def passed(self) -> bool:
        """True when no check failed."""
        return not self.failures


# -- loading -------------------------------------------------------------------------------

_RULE_KEYS = {"name", "metric", "max", "min", "statistic", "min_trials", *CELL}
_BASELINE_KEYS = {"alpha", "metrics", "match"}
_TOP_KEYS = {"rule", "baseline", "confidence", "description"}


def _patterns(value: Any, where: str, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise GateError(
            f"{where}: {key!r} must be a string or a non-empty list of strings, got {value!r}"
        )
    return tuple(value)


def _probability(value: Any, where: str, key: str, *, open_interval: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and open_interval:
        ok = 0 < value < 1
    elif ok:
        ok = 0 <= value <= 1
    if not ok:
        interval = "strictly between 0 and 1" if open_interval else "between 0 and 1"
        raise GateError(f"{where}: {key!r} must be a number {interval}, got {value!r}")
    return float(value)


def _rule(block: Any, index: int, source: str) -> Rule:
    where = f"{source} [[rule]] #{index}"
    if not isinstance(block, dict):
        raise GateError(f"{where}: must be a table, got {block!r}")
    unknown = set(block) - _RULE_KEYS
    if unknown:
        raise GateError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"expected: {', '.join(sorted(_RULE_KEYS))}"
        )
    metric_name = block.get("metric")
    known = metric_names()
    if metric_name is None:
        raise GateError(f"{where}: 'metric' is missing; give one of: {', '.join(known)}")
    if metric_name not in known:
        raise GateError(
            f"{where}: unknown metric {metric_name!r}; expected one of: {', '.join(known)}"
        )
    is_rate = _is_rate(metric_name)
    if ("max" in block) == ("min" in block):
        given = "both" if "max" in block else "neither"
        raise GateError(
            f"{where}: give exactly one of 'max' or 'min' (the bound on {metric_name}), got {given}"
        )
    direction: Literal["max", "min"] = "max" if "max" in block else "min"
    raw_bound = block[direction]
    if is_rate:
        bound = _probability(raw_bound, where, direction)
    elif isinstance(raw_bound, (int, float)) and not isinstance(raw_bound, bool) and raw_bound >= 0:
        bound = float(raw_bound)
    else:
        raise GateError(f"{where}: {direction!r} must be a non-negative number, got {raw_bound!r}")
    cautious: Statistic = "upper" if direction == "max" else "lower"
    statistic = block.get("statistic", cautious if is_rate else "point")
    if statistic not in STATISTICS:
        raise GateError(
            f"{where}: unknown statistic {statistic!r}; expected one of: {', '.join(STATISTICS)}"
        )
    if not is_rate and statistic != "point":
        raise GateError(
            f"{where}: {metric_name} is a mean without an interval; statistic must be 'point', "
            f"got {statistic!r}"
        )
    if is_rate and statistic == cautious and bound == (0.0 if direction == "max" else 1.0):
        # An interval's upper bound is above 0 (its lower below 1) after any number of trials:
        # the rule could never pass, and --until-decided would run every cell to its cap.
        seen, inside = ("none", "above 0") if direction == "max" else ("all", "below 1")
        raise GateError(
            f"{where}: {direction} = {raw_bound!r} on the {statistic} bound of {metric_name} can "
            f"never pass (no number of trials proves a rate exactly {bound:g}); for "
            f"'{seen} seen' use statistic = \"point\", or give a {direction} {inside}"
        )
    min_trials = block.get("min_trials", 1)
    if not isinstance(min_trials, int) or isinstance(min_trials, bool) or min_trials < 1:
        raise GateError(f"{where}: 'min_trials' must be an integer ≥ 1, got {min_trials!r}")
    filters = {axis: _patterns(block[axis], where, axis) for axis in CELL if axis in block}
    name = block.get("name", f"{metric_name} {direction} {raw_bound}")
    if not isinstance(name, str) or not name.strip():
        raise GateError(f"{where}: 'name' must be a non-empty string, got {name!r}")
    return Rule(name.strip(), metric_name, bound, direction, statistic, min_trials, filters)


def _baseline(block: Any, source: str) -> BaselinePolicy:
    where = f"{source} [baseline]"
    if not isinstance(block, dict):
        raise GateError(f"{where}: must be a table, got {block!r}")
    unknown = set(block) - _BASELINE_KEYS
    if unknown:
        raise GateError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"expected: {', '.join(sorted(_BASELINE_KEYS))}"
        )
    alpha = _probability(block.get("alpha", 0.05), where, "alpha", open_interval=True)
    names = _patterns(block.get("metrics", list(COMPARED)), where, "metrics")
    rates = metric_names("rate")
    for m in names:
        if m not in rates:
            raise GateError(
                f"{where}: metric {m!r} cannot be compared with a test of proportions; "
                f"expected one of: {', '.join(rates)}"
            )
    match = block.get("match", list(CELL))
    if match == []:
        match_keys: tuple[str, ...] = ()
    else:
        match_keys = _patterns(match, where, "match")
    for k in match_keys:
        if k not in CELL:
            raise GateError(
                f"{where}: unknown match key {k!r}; expected some of: {', '.join(CELL)}"
            )
    return BaselinePolicy(alpha, names, match_keys)


def load_gate(path: str | Path) -> GateConfig:
    """Read and validate a gate TOML file.

    Raises:
        GateError: for a missing file, malformed TOML, or a bad key or value, naming it and
            what would be accepted.
    """
    try:
        p, raw = read_shipped(path, "gate file")
    except ValueError as ex:
        raise GateError(str(ex)) from None
    try:
        data = tomllib.loads(raw.decode("utf-8-sig"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as ex:
        raise GateError(f"gate file {str(p)!r} is not valid TOML: {ex}") from None
    return parse_gate(data, source=str(p))


def parse_gate(data: Mapping[str, Any], source: str = "<config>") -> GateConfig:
    """Validate an already-parsed gate document (see :func:`load_gate`)."""
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise GateError(
            f"{source}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"expected: {', '.join(sorted(_TOP_KEYS))}"
        )
    blocks = data.get("rule", [])
    if not isinstance(blocks, list):
        raise GateError(
            f"{source}: rules are written as [[rule]] blocks (a list of tables), got {blocks!r}"
        )
    rules = tuple(_rule(b, i, source) for i, b in enumerate(blocks, start=1))
    names = [r.name for r in rules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise GateError(f"{source}: rule names must be distinct; repeated: {', '.join(dupes)}")
    confidence = _probability(
        data.get("confidence", 0.95), source, "confidence", open_interval=True
    )
    baseline = _baseline(data["baseline"], source) if "baseline" in data else BaselinePolicy()
    return GateConfig(rules, confidence, baseline, source)


# -- evaluating ----------------------------------------------------------------------------


def _num(name: str, x: float) -> str:
    if math.isnan(x):
        return "n/a"
    return f"{x:.1%}" if _is_rate(name) else f"{x:.3g}"


def cell_label(cell: Mapping[str, Any]) -> str:
    """The label of a cell given as a mapping with the :data:`CELL` keys (a summary entry, a
    frame row): ``Cell.from_mapping(cell).label``."""
    return Cell.from_mapping(cell).label


@dataclass(frozen=True)
class _CellTrials:
    """One cell of the trial frame, as the gate checks it."""

    cell: Cell
    errors: int
    scored: pd.DataFrame


def _with_crashed(trials: pd.DataFrame) -> pd.DataFrame:
    """The frame with the ``crashed`` column a ``crashed_rate`` check reads: a frame without it
    (built by hand, or by code from before agents under test) had no agent that could crash."""
    column = AGENT_CRASHED.column
    return trials if column in trials else trials.assign(**{column: 0.0})


def _cells(trials: pd.DataFrame) -> list[_CellTrials]:
    out = []
    for key, group in trials.groupby(list(CELL), sort=True, dropna=False):
        scored = group[group["completed"].notna()]
        errors = int(errored(group).sum())
        cell = Cell.from_mapping(dict(zip(CELL, key, strict=True)))
        out.append(_CellTrials(cell, errors, scored))
    return out


def _check_rule(rule: Rule, cell: _CellTrials, confidence: float) -> Check:
    column = metric(rule.metric).column
    # A trial scored before the metric existed (an older log) has no value for it: it is not
    # a trial that measured 0, so it does not count toward min_trials.
    values = cell.scored[column].dropna() if column in cell.scored else pd.Series(dtype=float)
    n = len(values)
    label = cell.cell.label
    excluded = f"; {cell.errors} errored trial(s) excluded" if cell.errors else ""
    if unmeasured := len(cell.scored) - n:
        excluded += f"; {unmeasured} trial(s) scored before twice measured {column}"
    lo = hi = math.nan
    if _is_rate(rule.metric):
        k = int(values.sum())
        point = k / n if n else math.nan
        lo, hi = wilson(k, n, alpha=alpha_of(confidence))
        value = {"point": point, "lower": lo, "upper": hi}[rule.statistic]
        evidence = (
            f"{k} of {n} trials {column}: {rule.metric} {_num(rule.metric, point)}, "
            f"Wilson {confidence:.0%} interval [{_num(rule.metric, lo)}, {_num(rule.metric, hi)}]"
        )
    else:
        value = float(values.mean())  # NaN over no trials
        evidence = f"{rule.metric} {_num(rule.metric, value)} over {n} trials"
    shown = (
        rule.statistic if rule.statistic == "point" else f"{rule.statistic} {confidence:.0%} bound"
    )
    if n < rule.min_trials:
        if _is_rate(rule.metric) and _certain_fail(rule, lo, hi):
            # The interval already excludes the bound on the wrong side: more trials would
            # not rescue the rule (28 of 28 duplicated against max 5%), so say so.
            side = "lower" if rule.direction == "max" else "upper"
            past = "above" if rule.direction == "max" else "below"
            return Check(
                "rule",
                rule.name,
                label,
                "fail",
                f"fails regardless of more trials: the {side} {confidence:.0%} bound is "
                f"already {past} {rule.direction} {_num(rule.metric, rule.bound)} with {n} "
                f"scored trial(s) of the {rule.min_trials} required ({evidence}{excluded})",
            )
        return Check(
            "rule",
            rule.name,
            label,
            "fail",
            f"only {n} scored trial(s); the rule needs at least {rule.min_trials} "
            f"({evidence}{excluded})",
        )
    ok = value <= rule.bound if rule.direction == "max" else value >= rule.bound
    op = ("≤" if ok else ">") if rule.direction == "max" else ("≥" if ok else "<")
    message = (
        f"{shown} of {rule.metric} = {_num(rule.metric, value)} {op} "
        f"{rule.direction} {_num(rule.metric, rule.bound)} ({evidence}{excluded})"
    )
    return Check("rule", rule.name, label, "pass" if ok else "fail", message)


def _certain_fail(rule: Rule, lo: float, hi: float) -> bool:
    """Whether the interval lies wholly on the failing side of the rule's bound."""
    if math.isnan(lo):
        return False
    return lo > rule.bound if rule.direction == "max" else hi < rule.bound


def _no_match(rule: Rule, cells: list[_CellTrials]) -> Check:
    want = ", ".join(f"{axis}={list(p)}" for axis, p in rule.filters.items()) or "(no filters)"
    if not cells:  # e.g. --allow-errors on a run interrupted before any trial finished
        return Check(
            "rule", rule.name, "(no cell)", "fail",
            f"no cell matches {want}: the logs hold no scored trial",
        )  # fmt: skip
    # A rule without filters matches every cell: here, with cells, it has some.
    present = {axis: sorted({getattr(c.cell, axis) for c in cells}) for axis in rule.filters}
    have = "; ".join(f"{axis}: {', '.join(v)}" for axis, v in present.items())
    return Check(
        "rule", rule.name, "(no cell)", "fail", f"no cell matches {want}; the logs hold {have}"
    )


def _check_baseline(
    name: str, cell: _CellTrials, base: pd.DataFrame, policy: BaselinePolicy
) -> Check:
    column = metric(name).column
    label = cell.cell.label
    mask = pd.Series(True, index=base.index)
    for key in policy.match:
        mask &= base[key].astype(str) == getattr(cell.cell, key)
    paired = base[mask & base["completed"].notna()]
    n1, n0 = len(cell.scored), len(paired)
    if n0 == 0 or n1 == 0:
        which = "the baseline has no scored trials" if n0 == 0 else "this cell has no scored trials"
        pairing = ", ".join(f"{k}={getattr(cell.cell, k)}" for k in policy.match) or "all trials"
        return Check("baseline", name, label, "skip", f"{which} for {pairing}")
    k1, k0 = int(cell.scored[column].sum()), int(paired[column].sum())
    test = baseline_test(name, k1, n1, k0, n0, alpha=policy.alpha)
    p = test.p_worse
    worse = test.verdict == "worse"
    numbers = (
        f"{name} {_num(name, k1 / n1)} ({k1}/{n1}) vs baseline {_num(name, k0 / n0)} ({k0}/{n0})"
    )
    verdict = "significantly worse" if worse else "not significantly worse"
    sign = "<" if worse else "≥"
    return Check(
        "baseline",
        name,
        label,
        "fail" if worse else "pass",
        f"{numbers}: {verdict} (Fisher's exact test, one-sided p = {p:.3g} {sign} "
        f"alpha {policy.alpha:g})",
    )


def _no_pair(
    name: str, cells: list[_CellTrials], base: pd.DataFrame, policy: BaselinePolicy
) -> Check:
    """A baseline metric no cell could be compared on fails: a gate that compared nothing (a
    renamed agent, a baseline of other tasks) must not pass a release as "no regression"."""
    scored = base[base["completed"].notna()]
    differ = []
    for key in policy.match:
        ours = sorted({getattr(c.cell, key) for c in cells})
        theirs = sorted(set(scored[key].astype(str)))
        if set(ours) != set(theirs):
            differ.append(f"{key}: {', '.join(ours) or '-'} vs baseline {', '.join(theirs) or '-'}")
    why = "; ".join(differ) or "neither side has scored trials in a shared cell"
    return Check(
        "baseline", name, "(no cell)", "fail",
        f"no cell could be compared with the baseline on {', '.join(policy.match) or 'all trials'}"
        f" ({why})",
    )  # fmt: skip


def _check_sequential(rule: Rule, cell: _CellTrials, confidence: float) -> Check:
    excluded = f"; {cell.errors} errored trial(s) excluded" if cell.errors else ""
    state = rule_state(rule, cell.scored, confidence, excluded)
    return Check("rule", rule.name, cell.cell.label, state.status, state.message)


def evaluate_gate(
    trials: pd.DataFrame,
    config: GateConfig,
    baseline: pd.DataFrame | None = None,
    *,
    sequential: Mapping[str, Any] | None = None,
) -> GateResult:
    """Check every rule in every cell it matches, and compare with a baseline if given.

    Args:
        trials: The trial frame (:func:`reports.trials_frame`).
        config: The parsed gate file.
        baseline: The baseline's trial frame, for regression checks.
        sequential: The ``sequential`` record of a ``twice run --until-decided`` run
            (summary.json's ``run.sequential``): rules on rates then use anytime-valid
            bounds (a confidence sequence), valid although the run looked after every round.
    """
    trials = _with_crashed(trials)
    if baseline is not None:
        baseline = _with_crashed(baseline)
    cells = _cells(trials)
    checks: list[Check] = []
    check = _check_rule if sequential is None else _check_sequential
    for rule in config.rules:
        matched = [c for c in cells if rule.matches(c.cell.as_dict())]
        if not matched:
            checks.append(_no_match(rule, cells))
        checks.extend(check(rule, c, config.confidence) for c in matched)
    if baseline is not None:
        for name in config.baseline.metrics:
            compared = [_check_baseline(name, c, baseline, config.baseline) for c in cells]
            checks.extend(compared)
            if all(c.status == "skip" for c in compared):
                checks.append(_no_pair(name, cells, baseline, config.baseline))
    notes = []
    if sequential is not None:
        notes.append(describe(sequential))
    errored = sum(c.errors for c in cells)
    if errored:
        notes.append(f"{errored} errored trial(s) were excluded from the rates")
    return GateResult(checks, notes)


# -- reporting -----------------------------------------------------------------------------


def format_gate(result: GateResult) -> str:
    """A human summary: one line per check, the failures last, spelled out with their numbers."""
    lines = []
    order = {"pass": 0, "skip": 1, "fail": 2}
    for c in sorted(result.checks, key=lambda c: order[c.status]):
        tag = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}[c.status]
        head = f"{tag}  {c.group} {c.name!r} [{c.cell}]"
        lines.append(f"{head}\n      {c.message}" if c.status != "pass" else f"{head}: {c.message}")
    for note in result.notes:
        lines.append(f"note: {note}")
    n_fail = len(result.failures)
    n_skip = sum(c.status == "skip" for c in result.checks)
    n_pass = len(result.checks) - n_fail - n_skip
    verdict = "FAILED" if n_fail else "passed"
    lines.append(f"gate {verdict}: {n_pass} passed, {n_fail} failed, {n_skip} skipped")
    return "\n".join(lines)


def junit_xml(
    checks: Sequence[Check], *, suite: str = "twice gate", errors: Sequence[str] = ()
) -> bytes:
    """JUnit XML: one test case per check (rule × cell), failures carry the message.

    Args:
        checks: The checks to write.
        suite: The test-suite name CI shows.
        errors: Problems that stopped the gate (unreadable or errored logs), each written as
            an ``<error>`` test case.
    """
    n_fail = sum(c.status == "fail" for c in checks)
    n_skip = sum(c.status == "skip" for c in checks)
    counts = {
        "tests": str(len(checks) + len(errors)),
        "failures": str(n_fail),
        "errors": str(len(errors)),
        "skipped": str(n_skip),
    }
    root = ET.Element("testsuites", {"name": suite, **counts})
    ts = ET.SubElement(root, "testsuite", {"name": suite, **counts})
    for c in checks:
        case = ET.SubElement(
            ts, "testcase", {"classname": f"twice.{c.group}.{c.name}", "name": c.cell}
        )
        if c.status == "fail":
            ET.SubElement(case, "failure", {"message": c.message, "type": c.group}).text = c.message
        elif c.status == "skip":
            ET.SubElement(case, "skipped", {"message": c.message})
        else:
            ET.SubElement(case, "system-out").text = c.message
    for i, message in enumerate(errors, start=1):
        case = ET.SubElement(ts, "testcase", {"classname": "twice.logs", "name": f"logs #{i}"})
        ET.SubElement(case, "error", {"message": message, "type": "logs"}).text = message
    ET.indent(root)
    data: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return data + b"\n"


def write_junit(
    checks: Sequence[Check],
    path: str | Path,
    *,
    suite: str = "twice gate",
    errors: Sequence[str] = (),
) -> str | Path:
    """Write :func:`junit_xml` to ``path`` (a path, or an fsspec URI such as
    ``s3://bucket/run/gate.xml``) whole, and return it."""
    data = junit_xml(checks, suite=suite, errors=errors)
    if is_remote(path):
        write_text(str(path), data.decode("utf-8"))  # an object is replaced whole
        return str(path)
    out = Path(as_location(path))  # a file:// URI as the path it names
    replace_local(out, lambda tmp: tmp.write_bytes(data))
    return out
