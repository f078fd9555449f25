"""``twice.evals.serve`` stays cut to size: one job per module, functions a reader can hold."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVE = Path(__file__).resolve().parents[2] / "evals" / "serve"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def long_functions(source: str, limit: int) -> list[str]:
    """``name (N lines)`` for each function (methods and nested ones too) over ``limit``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found.append(f"{node.name} ({lines} lines)")
    return found


@pytest.mark.parametrize("path", sorted(SERVE.glob("*.py")), ids=lambda p: p.name)
def test_serve_layout_module_is_cut_to_size(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    lines = source.count("\n")
    assert lines <= MAX_MODULE_LINES, (
        f"{path.name} has {lines} lines (at most {MAX_MODULE_LINES}): split it by job"
    )
    long = long_functions(source, MAX_FUNCTION_LINES)
    assert not long, f"{path.name}: over {MAX_FUNCTION_LINES} lines: {long}; split into helpers"


def test_serve_layout_check_catches_a_long_function() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def short():\n    pass\n\ndef f():\n{body}", MAX_FUNCTION_LINES) == [
        f"f ({MAX_FUNCTION_LINES + 1} lines)"
    ]
