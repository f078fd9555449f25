"""Every inspect_ai private name twice uses, checked where twice reaches it.

twice uses a few of inspect's private names (``tests/test_layering.py`` keeps them in the
``_inspect_compat`` modules). Each test here fails, naming the name, when an inspect release
moves or reshapes one, instead of twice quietly losing the behaviour built on it.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from contextvars import ContextVar
from pathlib import Path

from twice.evals import _inspect_compat as evals_compat
from twice.mocks import _inspect_compat as mocks_compat
from twice.tasks import _inspect_compat as tasks_compat


def test_inspect_compat_sample_state_is_there() -> None:
    # A stub model finds its trial through the running sample's TaskState.
    assert callable(mocks_compat.sample_state)


def test_inspect_compat_registry_functions_are_there() -> None:
    for fn in (
        tasks_compat.registry_info,
        tasks_compat.set_registry_info,
        tasks_compat.set_registry_params,
        tasks_compat.is_registry_object,
    ):
        assert callable(fn), fn
    assert list(inspect.signature(tasks_compat.set_registry_params).parameters)[:2] == [
        "o",
        "params",
    ]


def test_inspect_compat_store_events_switch_is_a_context_variable() -> None:
    # Without it every span copies the store (measured in bench/): twice sets it per task.
    assert isinstance(tasks_compat.store_events_suspended, ContextVar)
    assert tasks_compat.store_events_suspended.get(False) in (True, False)


def test_inspect_compat_bridge_request_patch_is_there() -> None:
    from inspect_ai.agent._bridge import bridge

    assert callable(bridge.init_bridge_request_patch)
    assert not inspect.signature(bridge.init_bridge_request_patch).parameters


def test_inspect_compat_dotenv_and_the_provider_registry_are_there() -> None:
    from inspect_ai._util import dotenv

    assert callable(dotenv.init_dotenv)
    assert "openai" in evals_compat.model_api_names()
    from inspect_ai._util import entrypoints

    assert callable(entrypoints.ensure_entry_points)
    assert {"openai", "stub"} <= set(evals_compat.model_api_names(plugins=True))


def test_inspect_compat_rich_display_draws_the_results_table_in_tasks_results() -> None:
    module = evals_compat.rich_display()
    assert module is not None and callable(module.tasks_results)


def test_inspect_compat_provider_sdk_flags_are_booleans() -> None:
    internal = evals_compat.assistant_internal()
    assert isinstance(internal._HAS_OPENAI, bool)
    assert isinstance(internal._HAS_ANTHROPIC, bool)


def test_inspect_compat_task_log_resolves_the_revision() -> None:
    assert callable(evals_compat.task_log().resolve_revision)


def test_inspect_compat_compaction_placeholder_is_the_one_inspect_writes() -> None:
    # A stub knows a result was compacted away only by inspect's placeholder text.
    from inspect_ai.model._compaction import edit

    assert mocks_compat.TOOL_RESULT_REMOVED == edit.TOOL_RESULT_REMOVED


def test_inspect_compat_installed_versions_are_read_once_per_process() -> None:
    # The agent bridge checks openai's version on every model call it answers.
    from inspect_ai._util import version

    tasks_compat.cache_installed_versions()
    assert hasattr(version._installed_version, "cache_info")
    assert version.has_required_version("openai", "0.0.1")
    hits = version._installed_version.cache_info().hits
    assert version.has_required_version("openai", "0.0.1")
    assert version._installed_version.cache_info().hits == hits + 1


def test_inspect_compat_bridge_converters_take_what_the_model_endpoint_passes() -> None:
    # The agent command's model endpoint answers each dialect through inspect's converter,
    # passing the arguments the sandbox bridge's host side passes.
    from inspect_ai.agent._bridge.anthropic_api import inspect_anthropic_api_request
    from inspect_ai.agent._bridge.completions import inspect_completions_api_request
    from inspect_ai.agent._bridge.responses import inspect_responses_api_request

    def names(fn: object) -> list[str]:
        return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]

    assert names(inspect_completions_api_request) == ["json_data", "headers", "bridge"]
    provider = ["json_data", "headers", "web_search", "code_execution", "bridge"]
    assert names(inspect_responses_api_request) == provider
    assert names(inspect_anthropic_api_request)[:5] == provider
    for fn in (
        evals_compat.completions_request,
        evals_compat.responses_request,
        evals_compat.anthropic_request,
    ):
        assert inspect.iscoroutinefunction(fn)


def test_inspect_compat_provider_errors_are_forwarded_and_limits_raised() -> None:
    import asyncio

    import pytest
    from inspect_ai.util import LimitExceededError

    async def down(data: dict[str, object], headers: dict[str, str] | None) -> dict[str, object]:
        raise RuntimeError("the model is down")

    async def limited(data: dict[str, object], headers: dict[str, str] | None) -> dict[str, object]:
        raise LimitExceededError("message", value=31, limit=30)

    failed: list[Exception] = []
    forwarded = asyncio.run(evals_compat.forward_provider_errors(down, failed.append)({}, None))
    payload = forwarded[evals_compat.provider_error_key()]
    assert isinstance(payload, dict) and "the model is down" in payload["message"]
    assert payload["status"] is None and failed == []
    with pytest.raises(LimitExceededError):
        asyncio.run(evals_compat.forward_provider_errors(limited, failed.append)({}, None))


EVAL_TIME_PROBE = """
import json, sys
from twice.evals import _inspect_compat, run_suite, suite_from_flags

names = _inspect_compat.EVAL_TIME_MODULES
before = [n for n in names if n in sys.modules]
suite = suite_from_flags(config=None, models=["stub/retry"], prompts=[], tasks=["refund"],
                         faults=["none"], protections=[], epochs=None, limit=1)
run_suite(suite, sys.argv[1], display="none", report=False)
print(json.dumps({"before": before, "after": [n for n in names if n in sys.modules]}))
"""


def test_inspect_compat_eval_time_modules_are_imported_by_an_eval_and_not_before(
    tmp_path: Path,
) -> None:
    # A parent imports them before forking workers; that saves each worker their import only
    # while inspect leaves them out of `import inspect_ai` and imports them in every eval.
    done = subprocess.run(
        [sys.executable, "-c", EVAL_TIME_PROBE, str(tmp_path / "logs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"before": [], "after": list(evals_compat.EVAL_TIME_MODULES)}
