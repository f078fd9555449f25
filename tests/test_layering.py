"""Dependencies point one way: mocks ← assertions ← tasks ← evals; reports reads only logs.

The one layering test for the whole tree. Packages import each other only as ``twice.<name>``
(the installed names): a bare ``import tasks`` would load a second copy of the package from the
repository root, or a user's own ``tasks/``.
"""

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
    # The benchmarks sit above everything; they only have to use the installed names.
    "bench": set(PACKAGES),
}
BARE = "bare"


def imported_packages(source: str) -> set[str]:
    """twice packages a module imports (``twice.tasks`` → ``tasks``); a bare name → ``bare``."""
    found: set[str] = set()
    modules: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "twice":
                found.update(alias.name for alias in node.names if alias.name in PACKAGES)
            else:
                modules.append(node.module)
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            # importlib.import_module("tasks.refund") or f"tasks.{name}": the literal head.
            name = node.args[0]
            if isinstance(name, ast.JoinedStr) and name.values:
                name = name.values[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                modules.append(name.value)
    for module in modules:
        parts = module.split(".")
        if parts[0] == "twice" and len(parts) > 1 and parts[1] in PACKAGES:
            found.add(parts[1])
        elif parts[0] in PACKAGES:
            found.add(BARE)
    return found


def _is_import_module(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name == "import_module"


@pytest.mark.parametrize("package", ALLOWED)
def test_layering_imports_point_one_way(package: str) -> None:
    bad = {}
    for path in (ROOT / package).rglob("*.py"):
        wrong = imported_packages(path.read_text(encoding="utf-8")) - ALLOWED[package] - {package}
        if wrong:
            bad[str(path.relative_to(ROOT))] = sorted(wrong)
    assert not bad, f"{package} may import only twice.{sorted(ALLOWED[package])}: {bad}"


def test_layering_check_catches_a_violation() -> None:
    source = "from twice.tasks import refund\nimport twice.evals.cli\nfrom twice import reports\n"
    assert imported_packages(source) == {"tasks", "evals", "reports"}


def test_layering_check_catches_a_bare_import() -> None:
    assert imported_packages("import mocks\nfrom . import x\n") == {BARE}


def test_layering_check_catches_a_bare_dynamic_import() -> None:
    source = 'import importlib\nimportlib.import_module(f"tasks.{name}.{name}")\n'
    assert imported_packages(source) == {BARE}
    assert imported_packages('import_module("twice.tasks.refund")\n') == {"tasks"}


def test_tests_import_the_installed_names() -> None:
    # A test that imports `tasks.refund` passes only when something else put the repository
    # root on sys.path first, and then exercises a second copy of the package.
    bare = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("*.py")
        if BARE in imported_packages(path.read_text(encoding="utf-8"))
    ]
    assert not bare, f"import twice.<package>, not the bare name: {bare}"
