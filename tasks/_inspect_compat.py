"""The one place ``twice.tasks`` uses inspect_ai's private names.

Each is imported here and nowhere else, and ``tests/test_inspect_compat.py`` checks it, so an
inspect release that moves one fails that test by name instead of changing behaviour quietly.
"""

from __future__ import annotations

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


__all__ = [
    "init_bridge_request_patch",
    "is_registry_object",
    "registry_info",
    "set_registry_info",
    "set_registry_params",
    "store_events_suspended",
]
