"""Dependencies point one way: mocks ← assertions ← tasks ← evals; reports reads only logs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mocks", "assertions", "tasks", "evals", "reports")
ALLOWED = {
    "mocks": set(),
    "assertions": {"mocks"},
    "tasks": {"mocks", "assertions"},
    "evals": {"mocks", "assertions", "tasks", "reports"},
    "reports": set(),
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_layering_imports_point_one_way(package: str) -> None:
    bad = {}
    for path in (ROOT / package).rglob("*.py"):
        wrong = imported_packages(path) - ALLOWED[package] - {package}
        if wrong:
            bad[str(path.relative_to(ROOT))] = sorted(wrong)
    assert not bad, f"{package} may import only {sorted(ALLOWED[package])}: {bad}"


def test_layering_check_catches_a_violation(tmp_path: Path) -> None:
    sneaky = tmp_path / "x.py"
    sneaky.write_text("from tasks import refund\nimport evals.cli\n")
    assert imported_packages(sneaky) == {"tasks", "evals"}
