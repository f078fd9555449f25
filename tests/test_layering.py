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
ERROR_ROOT = {"TwiceError", "UsageError", "RunError", "RETRY_SOURCES"}
"""All ``reports`` may import from ``twice.mocks``: the root of twice's exceptions and its two
kinds, which every package must be able to subclass, and the ledger's vocabulary of who sent
an attempt, which the frame's columns are named by. Nothing else of the mocks."""


def imported_packages(source: str, *, error_root_exempt: bool = False) -> set[str]:
    """twice packages a module imports (``twice.tasks`` → ``tasks``); a bare name → ``bare``.

    With ``error_root_exempt``, ``from twice.mocks import`` of names in :data:`ERROR_ROOT`
    only does not count.
    """
    found: set[str] = set()
    modules: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if (
            error_root_exempt
            and isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module == "twice.mocks"
            and {alias.name for alias in node.names} <= ERROR_ROOT
        ):
            continue
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


def sources(package: str) -> list[Path]:
    """The package's Python files, without the installed environments inside it: a command
    agent's folder (``tasks/agents/commands/NAME/``) holds its own ``.venv`` or
    ``node_modules``, third-party code that is not twice's."""
    root = ROOT / package
    return [
        p
        for p in root.rglob("*.py")
        if not any(
            part.startswith(".") or part == "node_modules" for part in p.relative_to(root).parts
        )
    ]


@pytest.mark.parametrize("package", ALLOWED)
def test_layering_imports_point_one_way(package: str) -> None:
    bad = {}
    for path in sources(package):
        source = path.read_text(encoding="utf-8")
        found = imported_packages(source, error_root_exempt=package == "reports")
        wrong = found - ALLOWED[package] - {package}
        if wrong:
            bad[str(path.relative_to(ROOT))] = sorted(wrong)
    assert not bad, f"{package} may import only twice.{sorted(ALLOWED[package])}: {bad}"


def test_layering_check_catches_a_violation() -> None:
    source = "from twice.tasks import refund\nimport twice.evals.cli\nfrom twice import reports\n"
    assert imported_packages(source) == {"tasks", "evals", "reports"}


def test_layering_reports_may_import_only_the_error_root_and_retry_sources_from_mocks() -> None:
    allowed = "from twice.mocks import RETRY_SOURCES, RunError, UsageError\n"
    assert imported_packages(allowed, error_root_exempt=True) == set()
    for wrong in (
        "from twice.mocks import Ledger\n",
        "from twice.mocks import UsageError, Ledger\n",
        "import twice.mocks\n",
        "from twice import mocks\n",
        "from twice.mocks._errors import UsageError\n",
    ):
        assert imported_packages(wrong, error_root_exempt=True) == {"mocks"}, wrong
    assert imported_packages(allowed) == {"mocks"}  # only reports is exempt


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


# -- the import graph: circles, private modules, inspect's internals --------------------------
#
# Every import counts, wherever it is written: at the top, inside a function (a lazy import
# only delays a circle to the first call) or under ``if TYPE_CHECKING`` (a circle mypy
# follows). Run this file (``python tests/test_layering.py``) to print the circles.

INSPECT_COMPAT = "_inspect_compat.py"
"""The one module per package that may use inspect_ai's private names (each use tested)."""


def module_name(path: Path) -> str:
    """``evals/run/_run.py`` → ``twice.evals.run._run``; a package is its ``__init__``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["twice", *parts])


def library_modules() -> dict[str, Path]:
    """Every module of the five packages, by its installed name."""
    return {module_name(p): p for pkg in PACKAGES for p in sources(pkg)}


def imports_of(name: str, path: Path, source: str, known: set[str]) -> set[str]:
    """The twice modules ``name`` imports (``from .x import y`` counts ``.x.y`` when that is a
    module, else ``.x``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                head = package.split(".")
                head = head[: len(head) - (node.level - 1)]
                base = ".".join([*head, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(sources: dict[str, tuple[Path, str]]) -> dict[str, set[str]]:
    """Module → the twice modules it imports, from ``{name: (path, source)}``."""
    known = set(sources)
    return {name: imports_of(name, path, text, known) for name, (path, text) in sources.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected group of two or more modules, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _library_sources() -> dict[str, tuple[Path, str]]:
    return {n: (p, p.read_text(encoding="utf-8")) for n, p in library_modules().items()}


def test_layering_has_no_import_circles() -> None:
    found = circles(import_graph(_library_sources()))
    assert not found, f"modules that import each other (lazily or not): {found}"


def test_layering_circle_check_sees_a_lazy_and_a_type_checking_import() -> None:
    sources = {
        "twice.a": (Path("a.py"), "def f():\n    from twice.b import g\n"),
        "twice.b": (Path("b.py"), "if TYPE_CHECKING:\n    from .a import f\n"),
        "twice.c": (Path("c.py"), "import twice.a\n"),
    }
    assert circles(import_graph(sources)) == [["twice.a", "twice.b"]]


def private_imports(name: str, imported: set[str]) -> list[str]:
    """The private modules ``name`` imports that are not its own package's (or a package it
    sits in): another package's private module, or a sibling sub-package's."""
    own = name.split(".")
    bad = []
    for target in sorted(imported):
        parts = target.split(".")
        private = [i for i, part in enumerate(parts) if part.startswith("_")]
        if not private:
            continue
        home = parts[: private[0]]  # the package the first private module belongs to
        if own[: len(home)] != home:
            bad.append(target)
    return bad


def test_layering_no_private_module_of_another_package_is_imported() -> None:
    graph = import_graph(_library_sources())
    bad = {name: wrong for name in graph if (wrong := private_imports(name, graph[name]))}
    assert not bad, f"import what you need from the package's facade (its __all__): {bad}"


def test_layering_private_import_check_catches_a_sibling_and_another_package() -> None:
    imported = {
        "twice.tasks._redact",  # another package's private module
        "twice.evals.run._run",  # a sibling sub-package's private module
        "twice.evals.scale._plan",  # its own package's
        "twice.evals.run",  # a facade
    }
    assert private_imports("twice.evals.scale._workers", imported) == [
        "twice.evals.run._run",
        "twice.tasks._redact",
    ]
    assert private_imports("twice.tasks.agents._solver", {"twice.tasks._redact"}) == []


def twice_private_imports(source: str) -> list[str]:
    """The twice modules and names a script imports that are private (a part starting with
    ``_``): ``twice.evals.suite._suite``, ``from twice.evals import _rates``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [f"{node.module}.{alias.name}" for alias in node.names]
        for module in modules:
            parts = module.split(".")
            if parts[0] == "twice" and any(p.startswith("_") for p in parts[1:]):
                found.append(module)
    return found


BENCH_NOT_YET_PUBLIC = {"_sequential.py"}
"""Bench scripts that still simulate the sequential gate through its private helpers, which
have no public home yet."""


def test_layering_bench_uses_only_public_names() -> None:
    # The benchmarks time what a user can call: a private import measures code a user never
    # reaches, and breaks on every internal move.
    bad = {
        path.name: names
        for path in sorted((ROOT / "bench").glob("*.py"))
        if path.name not in BENCH_NOT_YET_PUBLIC
        and (names := twice_private_imports(path.read_text(encoding="utf-8")))
    }
    assert not bad, f"bench/ imports twice's public names only (a package's __all__): {bad}"


def test_layering_bench_check_catches_each_form() -> None:
    source = (
        "from twice.evals.suite._suite import load_suite\n"
        "from twice.evals import _rates\n"
        "import twice.mocks._ledger\n"
        "from twice.evals import suite_from_flags\n"
        "from _common import paired\n"
    )
    assert twice_private_imports(source) == [
        "twice.evals.suite._suite.load_suite",
        "twice.evals._rates",
        "twice.mocks._ledger",
    ]


def inspect_private_names(source: str) -> list[str]:
    """inspect_ai's private modules and names a module imports (``inspect_ai._util...``,
    ``from inspect_ai.model import _assistant_internal``), by literal import or
    ``import_module("...")``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                modules = [arg.value]
        for module in modules:
            parts = module.split(".")
            if parts[0] == "inspect_ai" and any(p.startswith("_") for p in parts[1:]):
                found.append(module)
    return found


def test_layering_inspect_private_names_only_in_the_compat_modules() -> None:
    bad = {
        str(path.relative_to(ROOT)): names
        for path in library_modules().values()
        if path.name != INSPECT_COMPAT
        and (names := inspect_private_names(path.read_text(encoding="utf-8")))
    }
    assert not bad, f"use inspect_ai's private names only in {INSPECT_COMPAT}: {bad}"


def test_layering_inspect_private_check_catches_each_form() -> None:
    source = (
        "from inspect_ai._util.registry import registry_info\n"
        "from inspect_ai.model import _assistant_internal as internal\n"
        'importlib.import_module("inspect_ai._display.rich.display")\n'
        "from inspect_ai.model import get_model\n"
    )
    assert inspect_private_names(source) == [
        "inspect_ai._util.registry.registry_info",
        "inspect_ai.model._assistant_internal",
        "inspect_ai._display.rich.display",
    ]


if __name__ == "__main__":
    graph = import_graph(_library_sources())
    for group in circles(graph):
        print(" <-> ".join(group))
        for name in group:
            print(f"    {name} -> {', '.join(sorted(graph[name] & set(group)))}")
    print(f"{len(circles(graph))} circle(s) among {len(graph)} modules")
