"""``reports`` reads only inspect logs: it imports nothing from the rest of twice."""

from __future__ import annotations

import ast
from pathlib import Path

import reports

TWICE = {"mocks", "tasks", "assertions", "evals"}


def _imports(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_reports_imports_nothing_from_twice() -> None:
    root = Path(reports.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert files
    offending = {str(p.relative_to(root)): _imports(p.read_text()) & TWICE for p in files}
    assert {k: v for k, v in offending.items() if v} == {}


def test_imports_finds_a_forbidden_import() -> None:
    assert _imports("from mocks import Ledger\nimport evals.cli\nfrom . import x\n") == {
        "mocks",
        "evals",
    }
