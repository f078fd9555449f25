"""No module of the library past about 600 lines, no function of ``evals`` past about 80: a
module that long holds several jobs, and a function that long several steps."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 600
MAX_FUNCTION_LINES = 80
PACKAGES = ("mocks", "tasks", "assertions", "evals", "reports")
FUNCTIONS_CHECKED = ("evals",)
"""The packages whose functions are held to the limit (a task's tool table is one long
function by design: its tools are defined together)."""


def modules(package: str) -> Iterator[Path]:
    """The package's own Python modules: not an agent command's installed venv or
    node_modules, which live beside its source."""
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if not any(p.startswith(".") or p in ("node_modules", "__pycache__") for p in parts):
            yield path


@pytest.mark.parametrize("package", PACKAGES)
def test_module_size_stays_under_the_limit(package: str) -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in modules(package)
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"split these modules by job (at most {MAX_LINES} lines each): {long}"


def long_functions(path: Path, limit: int) -> dict[str, int]:
    """Functions (nested ones included, by qualified name) of ``path`` longer than ``limit``."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}."
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > limit:
                        found[name[:-1]] = lines
            visit(child, name)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


@pytest.mark.parametrize("package", FUNCTIONS_CHECKED)
def test_function_size_stays_under_the_limit(package: str) -> None:
    long = {
        f"{path.relative_to(ROOT)}:{name}": n
        for path in modules(package)
        for name, n in long_functions(path, MAX_FUNCTION_LINES).items()
    }
    assert not long, f"split these functions by step (at most {MAX_FUNCTION_LINES} lines): {long}"


def test_the_size_checks_fire(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "long.py"
    path.write_text(f"class C:\n    def f(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n")
    assert long_functions(path, MAX_FUNCTION_LINES) == {"C.f": MAX_FUNCTION_LINES + 1}
    assert long_functions(path, MAX_FUNCTION_LINES + 1) == {}
