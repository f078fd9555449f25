"""How many trials a bound needs: the function, the CLI table and the gate guide's copy of it."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from statsmodels.stats.proportion import proportion_confint
from twice.evals import trials_needed, trials_table

GATE_GUIDE = Path(__file__).parents[2] / "docs" / "guides" / "gate.md"
Z95 = 1.959963984540054  # two-sided 95% normal quantile


@pytest.mark.parametrize(
    ("rate", "expected"),
    [(0.10, 35), (0.05, 73), (0.02, 189), (0.01, 381), (0.005, 765), (0.001, 3838)],
)
def test_trials_needed_matches_the_closed_form_at_zero_events(rate: float, expected: int) -> None:
    # Wilson upper bound at 0 events is z²/(n+z²) ≤ p  ⇔  n ≥ z²(1−p)/p.
    assert math.ceil(Z95**2 * (1 - rate) / rate) == expected
    assert trials_needed(rate) == expected


@pytest.mark.parametrize("observed", [0, 1, 2, 5])
@pytest.mark.parametrize("rate", [0.05, 0.01])
def test_trials_needed_is_the_smallest_n_that_fits(rate: float, observed: int) -> None:
    n = trials_needed(rate, observed=observed)

    def upper(k: int, n: int) -> float:
        return float(proportion_confint(k, n, alpha=0.05, method="wilson")[1])

    assert upper(observed, n) <= rate < upper(observed, n - 1)


def test_trials_needed_for_a_rate_near_one_in_a_billion() -> None:
    # The search doubles n past 3.04e9, where an int64 n**2 overflowed and the bound was nan.
    n = trials_needed(1e-9)
    assert n == math.ceil(Z95**2 * (1 - 1e-9) / 1e-9)
    assert float(proportion_confint(0, n, alpha=0.05, method="wilson")[1]) <= 1e-9


def test_trials_needed_grows_with_confidence() -> None:
    assert (
        trials_needed(0.01, confidence=0.99)
        > trials_needed(0.01)
        > trials_needed(0.01, confidence=0.9)
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_rate": 0.0}, "max_rate"),
        ({"max_rate": 0.01, "confidence": 1.0}, "confidence"),
        ({"max_rate": 0.01, "observed": -1}, "observed"),
        # 1e-300 overflowed the arithmetic and printed 1.9e300 (the closed form: 3.8e300).
        ({"max_rate": 1e-300}, "below 1e-09"),
    ],
)
def test_trials_needed_rejects_bad_arguments(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        trials_needed(**kwargs)  # type: ignore[arg-type]


def test_trials_table_row_for_one_percent() -> None:
    assert "| ≤ 1% at 95% | 381 | 563 | 726 |" in trials_table().splitlines()


def test_trials_table_names_the_confidence_it_used() -> None:
    # It was rounded to whole percent: 0.975 read "98%", and 0.995 to 0.9999 all "100%".
    assert "| ≤ 1% at 97.5% |" in trials_table([0.01], 0.975)
    assert "| ≤ 1% at 99.99% |" in trials_table([0.01], 0.9999)
    # ... and then six significant digits: 0.9999999 read "100%".
    assert "| ≤ 0.07% at 99.99999% |" in trials_table([0.0007], 0.9999999)


def test_trials_cli_prints_the_table(twice: Callable[..., Any]) -> None:
    result = twice("trials")
    assert result.exit_code == 0
    assert result.stdout.strip() == trials_table()
    one = twice("trials", "--rate", "0.01", "--confidence", "0.99")
    assert f"| ≤ 1% at 99% | {trials_needed(0.01, 0.99):,} |" in one.stdout


def test_trials_table_in_the_gate_guide_is_current() -> None:
    assert trials_table() in GATE_GUIDE.read_text(encoding="utf-8"), (
        "docs/guides/gate.md's trials table is stale: paste the output of `twice trials`"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # It said "expected a rate ..., e.g. 0.01" of a confidence.
        (("--confidence", "nan"), "--confidence: nan is not a number; expected a number "
         "strictly between 0 and 1, e.g. 0.95"),
        (("--rate", "nan"), "--rate: nan is not a number; expected a rate strictly between"),
        # It named the internal parameter: "max_rate 1e-300 is below 1e-09".
        (("--rate", "1e-300"), "--rate: 1e-300 is below 1e-09: proving a rate that low"),
    ],
)  # fmt: skip
def test_trials_cli_bad_input_names_the_option(
    twice: Callable[..., Any], args: tuple[str, ...], message: str
) -> None:
    result = twice("trials", *args)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split()), result.stderr
