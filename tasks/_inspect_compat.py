"""The one place ``twice.tasks`` uses inspect_ai's private names.

Each is imported here and nowhere else, and ``tests/test_inspect_compat.py`` checks it, so an
inspect release that moves one fails that test by name instead of changing behaviour quietly.
"""

from __future__ import annotations

import functools
from contextvars import ContextVar

# A made tool carries inspect's registry entry: inspect has no public way to copy one.
from inspect_ai._util.registry import (
    is_registry_object,
    registry_info,
    set_registry_info,
    set_registry_params,
)

store_events_suspended: ContextVar[bool] | None
try:  # the per-task switch that stops spans copying the store (inspect_swarm uses it too)
    from inspect_ai.util._store import _store_events_suspended as store_events_suspended
except ImportError:  # pragma: no cover - a later inspect: spans track the store as before
    store_events_suspended = None


def init_bridge_request_patch() -> None:
    """Have inspect patch the provider SDKs' ``request`` for its agent bridge now, so twice can
    wrap the patched method (inspect otherwise patches it on first use, over twice's)."""
    # Imported when called: the agent bridge loads only for a framework agent.
    from inspect_ai.agent._bridge.bridge import init_bridge_request_patch as init

    init()


def cache_installed_versions() -> None:
    """Have inspect read each package's installed version once per process.

    Inspect's agent bridge checks the openai package's version when a trial opens the bridge
    and again on every model call it answers, each time by reading the package's metadata
    from disk (``importlib.metadata``: 2-4 ms of CPU a check, ten times twice's own cost of a
    model turn). The modules this process imported do not change while it runs, so the first
    answer stays the right one. An inspect without the function is left as it is."""
    try:
        from inspect_ai._util import version
    except ImportError:  # pragma: no cover - a later inspect
        return
    installed = getattr(version, "_installed_version", None)
    if callable(installed) and not hasattr(installed, "cache_info"):
        version._installed_version = functools.cache(installed)


__all__ = [
    "cache_installed_versions",
    "init_bridge_request_patch",
    "is_registry_object",
    "registry_info",
    "set_registry_info",
    "set_registry_params",
    "store_events_suspended",
]
