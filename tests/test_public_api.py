"""The public surface: `assertions.__all__` is pinned; other packages are checked for shape."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).parents[1]

ASSERTIONS_ALL = [
    "METRICS",
    "Assertion",
    "Compensated",
    "Count",
    "EffectFacts",
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


PACKAGES = ["assertions", "mocks", "tasks", "reports", "reports.stats", "evals"]


@pytest.mark.parametrize("package", PACKAGES)
def test_package_all_is_sorted_public_and_importable(package: str) -> None:
    module = importlib.import_module(f"twice.{package}")
    names = list(module.__all__)
    assert names == sorted(names, key=_isort_key)
    assert len(set(names)) == len(names)
    assert not [n for n in names if n.startswith("_")]
    assert not [n for n in names if not hasattr(module, n)]


@pytest.mark.parametrize("package", PACKAGES)
def test_package_exports_every_public_member(package: str) -> None:
    # Two ways, as httpx's test_exported_members.py: every name in __all__ exists, and
    # every public name the package defines is in __all__ (so nothing public is reachable
    # only by accident). Submodules and names imported from other libraries (a type used in
    # an annotation) are not members.
    module = importlib.import_module(f"twice.{package}")

    def member(value: object) -> bool:
        if isinstance(value, ModuleType):
            return False
        origin = getattr(value, "__module__", None)
        return origin is None or not isinstance(origin, str) or origin.startswith("twice.")

    public = {n for n, v in vars(module).items() if not n.startswith("_") and member(v)}
    assert sorted(public - set(module.__all__)) == [], "public but not in __all__"
    assert sorted(set(module.__all__) - set(vars(module))) == [], "in __all__ but missing"


def test_package_export_check_catches_a_stray_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from twice import reports

    monkeypatch.setattr(reports, "stray", 1, raising=False)
    with pytest.raises(AssertionError, match="public but not in __all__"):
        test_package_exports_every_public_member("reports")
    monkeypatch.delattr(reports, "stray")
    monkeypatch.setattr(reports, "__all__", [*reports.__all__, "ghost"])
    with pytest.raises(AssertionError, match="in __all__ but missing"):
        test_package_exports_every_public_member("reports")


def test_importing_the_packages_loads_neither_pytest_nor_the_plugins() -> None:
    # The plugins are opt-in: importing twice must not drag pytest into a user's program.
    code = (
        "import sys, twice.assertions, twice.evals; "
        "print(sorted(m for m in sys.modules if m == 'pytest' or m.endswith('pytest_plugin')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"
