"""The README's examples are the files in docs/examples, verbatim, and they run as shown."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
EXAMPLES = sorted(
    p for p in (ROOT / "docs" / "examples").rglob("*") if p.suffix in (".py", ".jsonl")
)


def test_readme_shows_every_example_verbatim(readme_blocks: dict[str, str]) -> None:
    assert EXAMPLES
    for path in EXAMPLES:
        anchor = f"example: {path.relative_to(ROOT).as_posix()}"
        assert anchor in readme_blocks, f"README.md has no block <!-- {anchor} -->"
        assert readme_blocks[anchor] == path.read_text(encoding="utf-8"), f"{anchor} drifted"


def test_readme_has_the_two_sections() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "\n## Write your own assertion\n" in text
    assert "\n## Test your own tool code with twice\n" in text


def test_own_assertion_example_prints_what_readme_shows(
    readme_blocks: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    runpy.run_path(str(ROOT / "docs" / "examples" / "own_assertion.py"), run_name="__main__")
    printed = capsys.readouterr().out
    assert "refunded total of order_1042: expected at most 499 cents, observed 998 cents" in printed
    assert printed == readme_blocks["output: docs/examples/own_assertion.py"]
