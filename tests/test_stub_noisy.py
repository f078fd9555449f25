"""stub/noisy gives rates strictly between 0 and 1 whose intervals cover its true rates."""

from __future__ import annotations

from pathlib import Path

import pytest

from evals._run import run_suite
from evals._suite import Matrix, Suite
from mocks import NOISY_RETRY_RATES


@pytest.fixture(scope="module")
def noisy_cells(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    suite = Suite(
        (
            Matrix(
                models=("stub/noisy",),
                prompts=tuple(NOISY_RETRY_RATES),
                tasks=("refund",),
                faults=("lost_reply",),
                protections=("bare",),
            ),
        ),
        epochs=4,
    )
    result = run_suite(suite, Path(tmp_path_factory.mktemp("noisy")), report=False)
    return {row["prompt"]: row for row in result.table.to_dict("records")}


@pytest.mark.parametrize("prompt", sorted(NOISY_RETRY_RATES))
def test_noisy_interval_covers_true_rate(
    noisy_cells: dict[str, dict[str, object]], prompt: str
) -> None:
    row = noisy_cells[prompt]
    p = NOISY_RETRY_RATES[prompt]
    lo, hi = row["duplication_ci"]  # type: ignore[misc]
    assert row["trials"] == 96
    assert 0.0 < row["duplication_rate"] < 1.0  # type: ignore[operator]
    assert lo <= p <= hi, f"{prompt}: true rate {p} outside [{lo:.3f}, {hi:.3f}]"


def test_noisy_prompts_are_ordered(noisy_cells: dict[str, dict[str, object]]) -> None:
    rates = {k: v["duplication_rate"] for k, v in noisy_cells.items()}
    assert rates["cautious"] < rates["baseline"] < rates["persistent"]  # type: ignore[operator]


def test_noisy_repeats_exactly(noisy_cells: dict[str, dict[str, object]], tmp_path: Path) -> None:
    again = run_suite(
        Suite(
            (
                Matrix(
                    models=("stub/noisy",),
                    prompts=("baseline",),
                    tasks=("refund",),
                    faults=("lost_reply",),
                    protections=("bare",),
                ),
            ),
            epochs=4,
        ),
        tmp_path,
        report=False,
    )
    assert again.table.iloc[0]["duplication_rate"] == noisy_cells["baseline"]["duplication_rate"]
