"""stub/noisy gives rates strictly between 0 and 1 whose intervals cover its true rates.

A 95% interval misses its true rate one time in twenty, so a single interval proves little. The
test treats each epoch as an independent replication (its own per-trial seeds), builds one
Wilson interval per prompt and epoch, and checks that the intervals cover the documented rate
about as often as they should.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from twice.evals import run_suite
from twice.evals.suite._suite import Matrix, Suite
from twice.mocks import NOISY_RETRY_RATES
from twice.reports import cells, trials_frame

EPOCHS = 8


def noisy_suite(prompts: tuple[str, ...]) -> Suite:
    matrix = Matrix(
        models=("stub/noisy",),
        prompts=prompts,
        tasks=("refund",),
        faults=("lost_reply",),
        protections=("bare",),
    )
    return Suite((matrix,), epochs=EPOCHS)


@pytest.fixture(scope="module")
def noisy_trials(made_once: Callable[[str, Callable[[Path], None]], Path]) -> pd.DataFrame:
    def run(out: Path) -> None:
        run_suite(noisy_suite(tuple(NOISY_RETRY_RATES)), out, report=False)

    return trials_frame(made_once("noisy", run))


def test_noisy_per_epoch_intervals_cover_true_rates(noisy_trials: pd.DataFrame) -> None:
    per_epoch = cells(noisy_trials, by=("prompt", "epoch"))
    assert len(per_epoch) == len(NOISY_RETRY_RATES) * EPOCHS
    covered = [
        lo <= NOISY_RETRY_RATES[prompt] <= hi
        for prompt, (lo, hi) in zip(per_epoch["prompt"], per_epoch["duplication_ci"], strict=True)
    ]
    # Expected ≈ 95%; below 75% of 24 intervals has probability < 1e-4 for calibrated intervals.
    assert sum(covered) / len(covered) >= 0.75, per_epoch[["prompt", "epoch", "duplication_ci"]]


@pytest.mark.parametrize("prompt", sorted(NOISY_RETRY_RATES))
def test_noisy_pooled_rate_is_near_true_rate(noisy_trials: pd.DataFrame, prompt: str) -> None:
    row = cells(noisy_trials, by=("prompt",)).set_index("prompt").loc[prompt]
    p = NOISY_RETRY_RATES[prompt]
    assert 0.0 < row["duplication_rate"] < 1.0
    # n ≥ 190 trials: the standard error is at most 0.036, so 0.1 is about three of them.
    assert abs(row["duplication_rate"] - p) < 0.1, (prompt, row["duplication_rate"], p)


def test_noisy_prompts_are_ordered(noisy_trials: pd.DataFrame) -> None:
    rates = cells(noisy_trials, by=("prompt",)).set_index("prompt")["duplication_rate"]
    assert rates["cautious"] < rates["baseline"] < rates["persistent"]


def test_noisy_repeats_exactly(noisy_trials: pd.DataFrame, tmp_path: Path) -> None:
    run_suite(noisy_suite(("baseline",)), tmp_path, report=False)
    again = trials_frame(tmp_path).sort_values(["sample", "epoch"])["duplicated"].tolist()
    first = noisy_trials[noisy_trials["prompt"] == "baseline"]
    assert first.sort_values(["sample", "epoch"])["duplicated"].tolist() == again


def _duplicated(tmp_path: Path, name: str, *args: str) -> list[bool]:
    from click.testing import CliRunner
    from twice.evals.cli import cli

    out = tmp_path / name
    result = CliRunner().invoke(
        cli,
        ["run", "--model", "stub/noisy", "--task", "refund", "--fault", "lost_reply",
         "--log-dir", str(out), "--display", "none", "--no-report", *args],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return trials_frame(out).sort_values(["sample", "epoch"])["duplicated"].tolist()


def test_noisy_rate_comes_from_a_builtin_prompts_text_not_a_files_name(tmp_path: Path) -> None:
    # The failing path: a prompt file of the user's named cautious.md got the built-in
    # cautious prompt's rate (0.1) by its stem, so comparing it with another file showed a
    # difference that came from the file name alone. Other prompts' rate is 0.5.
    from twice.tasks import load_prompt

    mine = tmp_path / "mine" / "cautious.md"
    mine.parent.mkdir()
    mine.write_text("You are a support agent. This is my own cautious prompt.\n")
    same = tmp_path / "same" / "cautious.md"
    same.parent.mkdir()
    same.write_text(load_prompt("cautious").text)
    builtin = _duplicated(tmp_path, "builtin", "--prompt", "cautious")
    # The same seeds (they follow the name), the rate of other prompts:
    at_default = _duplicated(tmp_path, "default", "--prompt", "cautious", "-M", "p=0.5")
    assert builtin != at_default  # the rate shows in the trials, so the test can tell
    assert _duplicated(tmp_path, "mine", "--prompt", str(mine)) == at_default
    assert _duplicated(tmp_path, "same", "--prompt", str(same)) == builtin
