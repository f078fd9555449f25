"""The one place ``twice.evals`` uses inspect_ai's private names.

Each is reached through here and nowhere else, and ``tests/test_inspect_compat.py`` checks
it, so an inspect release that moves one fails that test by name. Each is imported when
asked for: most are speed-ups or messages that do nothing where the name is gone.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any


def init_dotenv() -> None:
    """Load a ``.env`` file from the working directory up, as the ``inspect`` CLI does."""
    from inspect_ai._util.dotenv import init_dotenv as init

    init()


def model_api_names(*, plugins: bool = False) -> list[str]:
    """The names of inspect's registered model providers (inspect lists them nowhere public).

    With ``plugins``, first the providers of every installed package that extends inspect
    (its ``inspect_ai`` entry points), which inspect itself loads only once a model string
    names them.
    """
    from inspect_ai._util.registry import registry_find, registry_info

    if plugins:
        from inspect_ai._util.entrypoints import ensure_entry_points

        ensure_entry_points()
    found: list[Any] = registry_find(lambda info: info.type == "modelapi")
    return sorted({registry_info(o).name.split("/")[-1] for o in found})


EVAL_TIME_MODULES = ("inspect_ai.agent._acp.server",)
"""Modules inspect imports inside every eval rather than when it is imported: its ACP server,
whose protocol schema costs about 0.4 s of CPU to import."""


def import_eval_time_modules() -> None:
    """Import :data:`EVAL_TIME_MODULES` now (a name an inspect release no longer has is
    skipped): a process about to fork workers imports them once, and each worker, a copy of
    it, starts its eval with them loaded instead of importing its own."""
    for name in EVAL_TIME_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


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


# The request converters of inspect's agent bridge, which the host side of its sandbox
# bridge uses (``inspect_ai/agent/_bridge/sandbox/service.py``): each turns a provider's
# request body into a generate on the eval's model through the bridge's state and filter,
# and its answer back into the provider's response. Imported when called: only an agent
# command's model endpoint needs them.


async def completions_request(json_data: dict[str, Any], bridge: Any) -> dict[str, Any]:
    """An OpenAI Chat Completions request answered through ``bridge``: the response's JSON."""
    from inspect_ai.agent._bridge.completions import inspect_completions_api_request

    completion = await inspect_completions_api_request(json_data, None, bridge)
    return dict(completion.model_dump(mode="json", warnings=False))


async def responses_request(json_data: dict[str, Any], bridge: Any) -> dict[str, Any]:
    """An OpenAI Responses request answered through ``bridge`` (no web search or code
    execution: withheld, as the sandbox bridge withholds them by default)."""
    from inspect_ai.agent._bridge.responses import inspect_responses_api_request

    response = await inspect_responses_api_request(json_data, None, None, None, bridge)
    return dict(response.model_dump(mode="json", warnings=False))


async def anthropic_request(json_data: dict[str, Any], bridge: Any) -> dict[str, Any]:
    """An Anthropic Messages request answered through ``bridge`` (no web search or code
    execution, as above)."""
    from inspect_ai.agent._bridge.anthropic_api import inspect_anthropic_api_request

    message = await inspect_anthropic_api_request(json_data, None, None, None, bridge)
    return dict(message.model_dump(mode="json", warnings=False))


Generate = Callable[[dict[str, Any], dict[str, str] | None], Awaitable[dict[str, Any]]]


class _FailureSink:
    """What inspect's error forwarding calls ``request_fail`` on (its sandbox bridge)."""

    def __init__(self, fail: Callable[[Exception], None]) -> None:
        self.request_fail = fail


def forward_provider_errors(generate: Generate, fail: Callable[[Exception], None]) -> Generate:
    """``generate`` with the sandbox bridge's error policy: a failed generate is returned as
    a provider-error payload under :func:`provider_error_key` (the agent gets an error
    reply and goes on), except a limit or a termination, which is raised (it ends the
    sample), and a refusal or response-filter failure, which is passed to ``fail`` (it must
    end the sample too) while the agent still gets an error reply."""
    from inspect_ai.agent._bridge.sandbox.service import _forward_provider_errors

    wrapped: Generate = _forward_provider_errors(generate, _FailureSink(fail))  # type: ignore[arg-type]
    return wrapped


def provider_error_key() -> str:
    """The key under which :func:`forward_provider_errors` returns a failed generate."""
    from inspect_ai.agent._bridge._errors import PROVIDER_ERROR_KEY

    return str(PROVIDER_ERROR_KEY)
