"""What a built-in framework agent builds per trial: only what is the trial's own.

The CA bundle (20-40 ms of CPU each time httpx or httpcore2 makes a client) and the
framework's tool objects (their schemas built from the signatures) cost more than a whole
trial of twice's own loop; they are made once per process and task. Timings are measured in
``bench/`` (``agent_overhead``), never here: these tests count the work instead.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from batch_eval import batch_eval
from inspect_ai.model import get_model
from twice.mocks import LEDGER_STORE_KEY
from twice.tasks import refund
from twice.tasks.agents import API_TOOLS, BUILTIN_AGENTS, AgentError, check_agent


def _installed() -> list[str]:
    names = []
    for name in BUILTIN_AGENTS:
        try:
            check_agent(name, "refund")
        except AgentError:
            continue
        names.append(name)
    return names


def _eval(agent: str, log_dir: Path) -> None:
    (log,) = batch_eval(
        refund(fault="none", agent=agent),
        model=get_model("stub/retry"),
        limit=3,
        log_dir=str(log_dir),
    )
    assert log.status == "success", log.error
    for sample in log.samples or []:
        assert len(sample.store[LEDGER_STORE_KEY]["effects"]) == 1, sample.id


@pytest.mark.parametrize("agent", _installed())
def test_a_builtin_agents_later_trials_load_no_ca_bundle_and_build_no_tools(
    agent: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _eval(agent, tmp_path)  # the process's first trials build what is shared
    bundles: list[object] = []
    load = ssl.SSLContext.load_verify_locations

    def counted_load(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        bundles.append(args or kwargs)
        load(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted_load)
    built: list[str] = []
    factory = API_TOOLS["refund"]

    def counted_factory(*args: Any) -> Any:
        built.append(agent)
        return factory(*args)

    monkeypatch.setitem(API_TOOLS, "refund", counted_factory)
    _eval(agent, tmp_path)
    assert bundles == [], f"{agent}: {len(bundles)} CA bundle loads in 3 trials"
    assert built == [], f"{agent}: its tools were built {len(built)} times in 3 trials"


def test_smolagents_later_trials_parse_no_prompt_yaml_and_render_no_system_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if "smolagents" not in _installed():
        pytest.skip("smolagents is not installed")
    import smolagents.agents
    import yaml

    _eval("smolagents", tmp_path)
    calls: list[str] = []
    safe_load, populate = yaml.safe_load, smolagents.agents.populate_template

    def counted_safe_load(*args: Any, **kwargs: Any) -> Any:
        calls.append("yaml")
        return safe_load(*args, **kwargs)

    def counted_populate(*args: Any, **kwargs: Any) -> Any:
        calls.append("template")
        return populate(*args, **kwargs)

    monkeypatch.setattr(yaml, "safe_load", counted_safe_load)
    monkeypatch.setattr(smolagents.agents, "populate_template", counted_populate)
    _eval("smolagents", tmp_path)
    assert calls == [], f"smolagents: {calls} in 3 trials"
