"""No module of the library past about 600 lines: a module that long holds several jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 600
CHECKED = ("mocks", "assertions", "reports")
"""The packages held to the limit; ``tasks`` and ``evals`` still have longer modules."""


@pytest.mark.parametrize("package", CHECKED)
def test_module_size_stays_under_the_limit(package: str) -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in sorted((ROOT / package).rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"split these modules by job (at most {MAX_LINES} lines each): {long}"
