"""Load a user's function from ``path/to/file.py:function`` or ``package.module:function``.

One loader for the two axes a user extends with code of their own: agents
(``--agent my_agent.py:run``) and tasks (``--task my_tasks.py:my_refund``).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any


def is_spec(value: str) -> bool:
    """Whether ``value`` has the shape ``where:function`` (not whether it loads)."""
    where, sep, attr = value.rpartition(":")
    return bool(sep and where and attr.isidentifier())


OPENAPI_PREFIX = "openapi:"
OPENAPI_TASK = "openapi:PATH[:DATASET.jsonl]"
"""How a task made from an OpenAPI document is named on the task axis."""
OVERRIDES_BESIDE = (".overrides.yaml", ".overrides.yml", ".overrides.toml")
"""Suffixes of an overrides file beside the document (``stripe.json`` →
``stripe.overrides.yaml``) that a task named ``openapi:PATH`` reads."""


def is_openapi_task(name: str) -> bool:
    """Whether ``name`` names a task made from an OpenAPI document (``openapi:PATH...``)."""
    return name.startswith(OPENAPI_PREFIX)


def split_openapi_task(name: str) -> tuple[str, str | None]:
    """``openapi:PATH[:DATASET.jsonl]`` → (PATH, DATASET or None)."""
    rest = name[len(OPENAPI_PREFIX) :]
    head, sep, tail = rest.rpartition(":")
    if sep and head and tail.endswith(".jsonl"):
        return head, tail
    return rest, None


def normal_spec(spec: str) -> str:
    """A file spec with its path normalised (``./agents/a.py:run`` → ``agents/a.py:run``,
    ``openapi:./x.json`` → ``openapi:x.json``), so two spellings of one path name one cell
    (and find its logs); other values unchanged."""
    if is_openapi_task(spec):
        document, dataset = split_openapi_task(spec)
        out = OPENAPI_PREFIX + os.path.normpath(document) if document else spec
        return out + (":" + os.path.normpath(dataset) if dataset else "")
    where, sep, attr = spec.rpartition(":")
    if not (sep and where.endswith(".py") and is_spec(spec)):
        return spec
    return f"{os.path.normpath(where)}:{attr}"


def spec_file(spec: str) -> Path | None:
    """The ``.py`` file a spec names, resolved (None for a module spec)."""
    where = spec.rpartition(":")[0]
    return Path(where).expanduser().resolve() if where.endswith(".py") else None


def file_digest(spec: str) -> str:
    """The first 12 hex digits of a sha256 over a spec's source and the user's own modules it
    imports ("" for a spec whose source is not found): recorded in a task's or agent's
    version, so editing the file, or a module of the user's it imports (a service, a helper),
    makes the logs written with the old code stale instead of reused on resume.

    The spec's source is its ``.py`` file, or a module spec's file. Its imports are followed
    through the source (``import``/``from`` statements anywhere in it, relative ones too)
    into every module that is the user's: a ``.py`` file outside the interpreter's and the
    environment's library directories and outside twice. A spec that imports none of the
    user's modules keeps the digest of its file alone.
    """
    if is_openapi_task(spec):
        return _openapi_digest(spec)
    root = spec_file(spec) or _module_file(spec.rpartition(":")[0])
    if root is None or not root.is_file():
        return ""
    digest = hashlib.sha256(root.read_bytes())
    for name, path in sorted(_own_imports(root, _package_of(spec)).items()):
        digest.update(f"\0{name}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _openapi_digest(spec: str) -> str:
    """The digest of an ``openapi:`` task's document and the overrides file beside it (its
    dataset's digest is the task's own, ``twice_task``)."""
    document = Path(split_openapi_task(spec)[0])
    if not document.is_file():
        return ""
    digest = hashlib.sha256(document.read_bytes())
    for suffix in OVERRIDES_BESIDE:
        beside = document.with_name(document.stem + suffix)
        if beside.is_file():
            digest.update(b"\0" + beside.read_bytes())
    return digest.hexdigest()[:12]


def _package_of(spec: str) -> str:
    """The package relative imports in a module spec's file resolve against ("" for a file)."""
    where = spec.rpartition(":")[0]
    if where.endswith(".py"):
        return ""
    module = _module_spec(where)
    return (module.parent or "") if module is not None else ""


def _module_spec(name: str, home: Path | None = None) -> importlib.machinery.ModuleSpec | None:
    """Where module ``name`` would load from, without importing anything (``find_spec`` of a
    dotted name imports its parents, running the user's package code just to hash it).

    ``home``, the directory of a file spec, is looked in first, so a file's digest covers its
    own neighbours whatever another file loaded under the same name earlier in the process.
    """
    parent, _, _ = name.rpartition(".")
    try:
        if home is not None and not parent:
            beside = importlib.machinery.PathFinder.find_spec(name, [str(home)])
            if beside is not None:
                return beside
        module = sys.modules.get(name)
        if module is not None:
            return getattr(module, "__spec__", None)
        if not parent:
            return importlib.util.find_spec(name)
        above = _module_spec(parent, home)
        where = above.submodule_search_locations if above is not None else None
        if not where:
            return None
        return importlib.machinery.PathFinder.find_spec(name, list(where))
    except Exception:  # a finder of an installed package may raise anything: not the user's
        return None


def _module_file(name: str, home: Path | None = None) -> Path | None:
    module = _module_spec(name, home) if name else None
    origin = module.origin if module is not None else None
    return Path(origin) if origin and origin.endswith(".py") else None


def _library_dirs() -> list[Path]:
    """Where code that is not the user's lives: the interpreter's and environment's libraries."""
    import site
    import sysconfig

    dirs = {p for k, p in sysconfig.get_paths().items() if k in _LIBRARY_KEYS}
    dirs.update(site.getsitepackages())
    dirs.add(site.getusersitepackages())
    return [Path(d).resolve() for d in dirs if d]


_LIBRARY_KEYS = ("stdlib", "platstdlib", "purelib", "platlib")


def _in_libraries(file: Path, libraries: list[Path]) -> bool:
    """Whether ``file`` is not the user's: under one of :func:`_library_dirs`."""
    return any(file.resolve().is_relative_to(d) for d in libraries)


def _own_imports(root: Path, package: str) -> dict[str, Path]:
    """Module name → file of every user module ``root`` imports, directly or through another."""
    libraries = _library_dirs()

    def library(file: Path) -> bool:
        return _in_libraries(file, libraries)

    home = None if package else root.parent  # a file spec's neighbours, found first
    found: dict[str, Path] = {}
    others: set[str] = {"twice"}  # top-level packages that are not the user's
    queue = [(root, package)]
    seen = {root.resolve()}
    while queue:
        path, pkg = queue.pop()
        for name in _imported_names(path, pkg):
            top = name.partition(".")[0]
            if top in others or name in found:
                continue
            file = _module_file(name, home)
            if file is None or library(file):
                if name == top and file is not None:
                    others.add(top)  # so its submodules are never looked up (or imported)
                continue
            found[name] = file
            if file.resolve() not in seen:
                seen.add(file.resolve())
                is_package = file.name == "__init__.py"
                queue.append((file, name if is_package else name.rpartition(".")[0]))
    return found


def _imported_names(path: Path, package: str) -> list[str]:
    """Every module an ``import`` or ``from`` statement in ``path`` may load, parents first."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if not package:
                    continue
                try:
                    base = importlib.util.resolve_name("." * node.level + base, package)
                except ImportError:
                    continue
            # `from pkg import name` loads pkg, and pkg.name when that is a module.
            modules = [base, *(f"{base}.{a.name}" for a in node.names if a.name != "*")]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            names.extend(".".join(parts[: i + 1]) for i in range(len(parts)) if parts[0])
    return names


def load_function(spec: str, kind: str, error: type[ValueError], accepted: str) -> Any:
    """The object named by ``spec`` (a ``.py`` file path or a module, then ``:name``).

    Args:
        spec: ``path/to/file.py:function`` or ``package.module:function``.
        kind: What it is, for messages (``agent``, ``task``).
        error: The exception to raise (a ``ValueError`` subclass).
        accepted: What is accepted, for the message on a value of the wrong shape.

    Raises:
        error: for a value of the wrong shape, a missing file or module, one that fails to
            import (naming the exception), or a module without that name.
    """
    where, _, attr = spec.rpartition(":")
    if not is_spec(spec):
        raise error(f"unknown {kind} {spec!r}; {accepted}")
    module = _load_file(spec, kind, error) if where.endswith(".py") else None
    if module is None:
        # As `python -m` does: a package in the working directory imports.
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())
        try:
            module = importlib.import_module(where)
        except Exception as ex:
            raise error(
                f"{kind} module {where!r} (from {spec!r}) failed to import: "
                f"{type(ex).__name__}: {ex}"
            ) from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise error(f"{where!r} has no function {attr!r} (from {kind} {spec!r})")
    return fn


def _load_file(spec: str, kind: str, error: type[ValueError]) -> ModuleType:
    where = spec.rpartition(":")[0]
    path = spec_file(spec)
    assert path is not None
    if not path.is_file():
        raise error(f"{kind} file {where!r} (from {spec!r}) does not exist")
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(f"twice_user_{kind}_{digest}", path)
    if module_spec is None or module_spec.loader is None:
        raise error(f"cannot load {kind} file {where!r}")
    module = importlib.util.module_from_spec(module_spec)
    # A helper beside the file imports (at load, and when the function runs later). Last on
    # the path, not first as `python file.py` has it: a file named like an installed package
    # (agents.py beside the OpenAI Agents SDK's `agents`) must not hide it from everything
    # else in the process.
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    try:
        with _own_neighbours(path):
            module_spec.loader.exec_module(module)
    except Exception as ex:
        raise error(f"{kind} file {where!r} failed to import: {type(ex).__name__}: {ex}") from None
    return module


@contextmanager
def _own_neighbours(path: Path) -> Iterator[None]:
    """While ``path`` loads, its imports of modules beside it load those modules.

    Python caches a module by name for the process, and finds an uncached one in the first
    directory on the path that has it: two task (or agent) files in different directories,
    each importing its own ``service.py``, would both get the first one loaded, and one of
    them be scored against the other's code. So each top-level name the file imports that
    lives beside it (:func:`_own_imports`, as its digest follows them) is looked up there
    first, and a cached module of that name from elsewhere is set aside for the load. The
    file's functions keep the modules they imported; the cache keeps the last file's.
    """
    home = path.parent.resolve()
    beside = _neighbours_imported(path, home)
    for name in beside:
        cached = sys.modules.get(name)
        origin = getattr(getattr(cached, "__spec__", None), "origin", None)
        if cached is not None and (origin is None or _neighbour(Path(origin)) != home):
            for loaded in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
                del sys.modules[loaded]
    finder = _BesideFinder(beside, str(home))
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def _neighbours_imported(path: Path, home: Path) -> set[str]:
    """The top-level modules beside ``path`` that it imports and that no installed package
    provides (an installed package still wins, as its place on the path says)."""
    libraries = _library_dirs()
    elsewhere = [p for p in sys.path if p and Path(p).resolve() != home]
    names = set()
    for name, file in _own_imports(path, "").items():
        if "." in name or name in sys.builtin_module_names or file.resolve() == path.resolve():
            continue
        if _neighbour(file) != home:
            continue
        found = importlib.machinery.PathFinder.find_spec(name, elsewhere)
        origin = found.origin if found is not None else None
        if origin and _in_libraries(Path(origin), libraries):
            continue
        names.add(name)
    return names


def _neighbour(file: Path) -> Path:
    """The directory a top-level module's ``file`` sits in: a package's parent, else its own."""
    file = file.resolve()
    return file.parent.parent if file.name == "__init__.py" else file.parent


class _BesideFinder(importlib.abc.MetaPathFinder):
    """Finds the named top-level modules in one directory (see :func:`_own_neighbours`)."""

    def __init__(self, names: set[str], home: str) -> None:
        self.names, self.home = names, home

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.home])
