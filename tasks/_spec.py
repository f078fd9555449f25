"""Load a user's function from ``path/to/file.py:function`` or ``package.module:function``.

One loader for the two axes a user extends with code of their own: agents
(``--agent my_agent.py:run``) and tasks (``--task my_tasks.py:my_refund``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any


def is_spec(value: str) -> bool:
    """Whether ``value`` has the shape ``where:function`` (not whether it loads)."""
    where, sep, attr = value.rpartition(":")
    return bool(sep and where and attr.isidentifier())


def spec_file(spec: str) -> Path | None:
    """The ``.py`` file a spec names, resolved (None for a module spec)."""
    where = spec.rpartition(":")[0]
    return Path(where).expanduser().resolve() if where.endswith(".py") else None


def file_digest(spec: str) -> str:
    """The first 12 hex digits of the sha256 of a spec's ``.py`` file ("" for a module or a
    file that is not there): recorded in a task's version, so editing the file makes the
    logs written with the old code stale instead of reused on resume."""
    path = spec_file(spec)
    if path is None or not path.is_file():
        return ""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


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
    try:
        module_spec.loader.exec_module(module)
    except Exception as ex:
        raise error(f"{kind} file {where!r} failed to import: {type(ex).__name__}: {ex}") from None
    return module
