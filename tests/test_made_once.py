"""The ``made_once`` fixture: a folder made by the first caller of a run and read by the rest."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

MadeOnce = Callable[[str, Callable[[Path], None]], Path]


def test_made_once_makes_a_folder_once_and_hands_it_to_every_caller(made_once: MadeOnce) -> None:
    calls: list[Path] = []

    def make(folder: Path) -> None:
        calls.append(folder)
        (folder / "made.txt").write_text("once", encoding="utf-8")

    first = made_once("made-once-test", make)
    again = made_once("made-once-test", make)
    assert first == again == calls[0]
    assert len(calls) == 1
    assert (again / "made.txt").read_text(encoding="utf-8") == "once"


def test_made_once_makes_again_after_a_make_that_failed(made_once: MadeOnce) -> None:
    def fail(folder: Path) -> None:
        (folder / "half.txt").write_text("half", encoding="utf-8")
        raise RuntimeError("make failed")

    with pytest.raises(RuntimeError, match="make failed"):
        made_once("made-once-failing", fail)
    folder = made_once("made-once-failing", lambda f: (f / "whole.txt").touch())
    assert sorted(p.name for p in folder.iterdir()) == ["whole.txt"]  # the half-made left
