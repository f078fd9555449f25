"""``load_function``: a user's file imports the modules beside it, whatever else is loaded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from twice.tasks._spec import load_function


def _two_sides(tmp_path: Path) -> None:
    """``v1/`` and ``v2/``, each with a task file importing a helper module and a helper
    package (with a submodule) of the same names, which say which side they are."""
    for side in ("v1", "v2"):
        home = tmp_path / side
        (home / "svc").mkdir(parents=True)
        (home / "helper.py").write_text(f"WHO = {side!r}\n")
        (home / "svc" / "__init__.py").write_text("")
        (home / "svc" / "core.py").write_text(f"WHO = {side!r}\n")
        (home / "task.py").write_text(
            "import helper\nfrom svc.core import WHO as SVC\n\n"
            "def who():\n    return helper.WHO, SVC\n"
        )


@pytest.fixture
def clean_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the test loads leaves the process's module cache and path as they were."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))


@pytest.mark.usefixtures("clean_imports")
@pytest.mark.parametrize("first", ["v1", "v2"])
def test_two_files_in_two_directories_each_import_their_own_neighbours(
    tmp_path: Path, first: str
) -> None:
    # The failing path: Python caches modules by name, so the second file's `import helper`
    # got the first file's helper: a task was scored against another task's service code
    # (two task files, each with its own sms_service.py, showed the same duplication rate).
    _two_sides(tmp_path)
    second = "v2" if first == "v1" else "v1"
    loaded = {
        side: load_function(f"{tmp_path / side / 'task.py'}:who", "task", ValueError, "")
        for side in (first, second)
    }
    assert loaded["v1"]() == ("v1", "v1")
    assert loaded["v2"]() == ("v2", "v2")


@pytest.mark.usefixtures("clean_imports")
@pytest.mark.parametrize("imports", ["", "import json\n"])
def test_the_standard_library_is_not_hidden_by_a_neighbour_of_its_name(
    tmp_path: Path, imports: str
) -> None:
    # An installed or standard module still wins over a file beside the task, as the
    # directory's place (last) on the path says, whether or not the task imports it.
    (tmp_path / "json.py").write_text("BROKEN = True\n")
    (tmp_path / "task.py").write_text(f"{imports}def t():\n    return 1\n")
    assert load_function(f"{tmp_path / 'task.py'}:t", "task", ValueError, "")() == 1
    import json

    assert not hasattr(json, "BROKEN") and json.dumps(1) == "1"
