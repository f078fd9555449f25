"""``file_digest``: a user's task or agent is versioned by its source and the modules of theirs
it imports, so a rerun never reuses logs written by code they have since edited."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from twice.tasks._spec import file_digest


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "digestproj"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks.py").write_text(
        "import httpx\nfrom . import service\nfrom .words import REASON\n\ndef t(): ...\n"
    )
    (pkg / "service.py").write_text("from digestproj import deep\nX = 1\n")
    (pkg / "deep.py").write_text("Y = 1\n")
    (pkg / "words.py").write_text("REASON = 'courtesy'\n")
    (pkg / "unrelated.py").write_text("Z = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.partition(".")[0] == "digestproj"]:
        monkeypatch.delitem(sys.modules, name)
    return pkg


@pytest.mark.parametrize("edited", ["tasks.py", "service.py", "deep.py", "words.py", "__init__.py"])
@pytest.mark.parametrize("form", ["module", "file"])
def test_editing_the_source_or_a_module_it_imports_changes_the_digest(
    project: Path, edited: str, form: str
) -> None:
    spec = "digestproj.tasks:t" if form == "module" else f"{project / 'tasks.py'}:t"
    before = file_digest(spec)
    assert len(before) == 12
    path = project / edited
    path.write_text(path.read_text() + "# edited\n")
    if form == "file" and edited in ("service.py", "deep.py", "words.py", "__init__.py"):
        # A file spec is loaded on its own: its relative imports name no package to follow.
        assert file_digest(spec) == before
    else:
        assert file_digest(spec) != before


def test_editing_a_module_it_does_not_import_leaves_the_digest(project: Path) -> None:
    before = file_digest("digestproj.tasks:t")
    (project / "unrelated.py").write_text("Z = 2\n")
    assert file_digest("digestproj.tasks:t") == before


def test_a_file_importing_none_of_the_users_modules_keeps_its_files_digest(tmp_path: Path) -> None:
    # Installed packages (httpx) and twice itself are not the user's: logs written before
    # imports were followed stay reusable.
    import hashlib

    source = tmp_path / "alone.py"
    source.write_text("import json\nimport httpx\nfrom twice.tasks import twice_task\n")
    assert file_digest(f"{source}:t") == hashlib.sha256(source.read_bytes()).hexdigest()[:12]


def test_a_spec_whose_source_is_missing_has_no_digest(tmp_path: Path) -> None:
    assert file_digest(f"{tmp_path / 'gone.py'}:t") == ""
    assert file_digest("no_such_module_here:t") == ""


def test_a_files_digest_covers_its_own_neighbour_whatever_was_loaded_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: "helper" resolved through the process's module cache, so a file's
    # digest depended on which other file's helper had been loaded first.
    import types

    for side in ("v1", "v2"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "agent.py").write_text("import helper\n")
        (tmp_path / side / "helper.py").write_text(f"WHO = {side!r}\n")
    spec = f"{tmp_path / 'v2' / 'agent.py'}:agent"
    alone = file_digest(spec)
    cached = types.ModuleType("helper")
    cached.__spec__ = importlib.util.spec_from_file_location("helper", tmp_path / "v1/helper.py")
    monkeypatch.setitem(sys.modules, "helper", cached)
    assert file_digest(spec) == alone
    (tmp_path / "v2" / "helper.py").write_text("WHO = 'edited'\n")
    assert file_digest(spec) != alone


def test_digesting_imports_nothing_of_the_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failing path: find_spec("heavy.sub") imported heavy/__init__.py, which ran (and
    # here raised) just so a file that names it under TYPE_CHECKING could be hashed.
    (tmp_path / "heavy").mkdir()
    (tmp_path / "heavy" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (tmp_path / "heavy" / "sub.py").write_text("T = int\n")
    task = tmp_path / "task.py"
    task.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from heavy.sub import T\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    before = file_digest(f"{task}:t")
    assert "heavy" not in sys.modules
    (tmp_path / "heavy" / "sub.py").write_text("T = str\n")
    assert file_digest(f"{task}:t") != before
