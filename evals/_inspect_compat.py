"""The one place ``twice.evals`` uses inspect_ai's private names.

Each is reached through here and nowhere else, and ``tests/test_inspect_compat.py`` checks
it, so an inspect release that moves one fails that test by name. Each is imported when
asked for: most are speed-ups or messages that do nothing where the name is gone.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


def init_dotenv() -> None:
    """Load a ``.env`` file from the working directory up, as the ``inspect`` CLI does."""
    from inspect_ai._util.dotenv import init_dotenv as init

    init()


def model_api_names() -> list[str]:
    """The names of inspect's registered model providers (inspect lists them nowhere public)."""
    from inspect_ai._util.registry import registry_find, registry_info

    found: list[Any] = registry_find(lambda info: info.type == "modelapi")
    return sorted({registry_info(o).name.split("/")[-1] for o in found})


def rich_display() -> ModuleType | None:
    """Inspect's rich display module (its ``tasks_results`` draws the end-of-set table)."""
    try:
        return importlib.import_module("inspect_ai._display.rich.display")
    except ImportError:
        return None


def assistant_internal() -> ModuleType:
    """The module whose ``_HAS_OPENAI``/``_HAS_ANTHROPIC`` flags say which provider SDKs get
    per-sample state."""
    from inspect_ai.model import _assistant_internal

    return _assistant_internal


def task_log() -> ModuleType:
    """Inspect's task logger module (its ``resolve_revision`` asks git for the revision)."""
    from inspect_ai._eval.task import log

    return log
