"""The public surface: `assertions.__all__` is pinned; other packages are checked for shape."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

ASSERTIONS_ALL = [
    "METRICS",
    "Assertion",
    "Compensated",
    "Count",
    "EndStateCheck",
    "Intent",
    "IntentResult",
    "NoUnseenEffects",
    "TrialMetrics",
    "Verdict",
    "assert_side_effects",
    "at_least",
    "at_most",
    "check_all",
    "compensated",
    "describe_attempt",
    "exactly",
    "never",
    "no_unseen_effects",
    "parse_assertion",
    "parse_assertions",
    "score_trial",
    "side_effect_assertions",
    "side_effects",
    "trial_metrics",
]


def _isort_key(name: str) -> tuple[int, str]:
    """ruff's RUF022 order: CONSTANTS, then Classes, then functions."""
    if name.isupper():
        return (0, name)
    return (1 if name[0].isupper() else 2, name)


def test_assertions_all_is_pinned() -> None:
    from twice import assertions

    assert assertions.__all__ == ASSERTIONS_ALL


@pytest.mark.parametrize("package", ["assertions", "mocks", "tasks", "reports", "evals"])
def test_package_all_is_sorted_public_and_importable(package: str) -> None:
    module = importlib.import_module(package)
    names = list(module.__all__)
    assert names == sorted(names, key=_isort_key)
    assert len(set(names)) == len(names)
    assert not [n for n in names if n.startswith("_")]
    assert not [n for n in names if not hasattr(module, n)]


def test_importing_the_packages_loads_neither_pytest_nor_the_plugins() -> None:
    # The plugins are opt-in: importing twice must not drag pytest into a user's program.
    code = (
        "import sys, assertions, evals; "
        "print(sorted(m for m in sys.modules if m == 'pytest' or m.endswith('pytest_plugin')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"
