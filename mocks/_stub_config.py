"""What a stub model reads besides the conversation: its trial's plan, prompt and seed.

Kept beside the running trial (:class:`~twice.mocks._live.TrialScoped`), or in the sample
store where inspect's running-sample accessor is missing.
"""

from __future__ import annotations

from typing import Any

from inspect_ai.util import store

from ._errors import RunError
from ._inspect_compat import sample_state as _sample_state
from ._live import TrialScoped

STUB_STORE_KEY = "twice:stub"
"""Store key of what stubs read (``{"plan", "prompt", "seed"}``) when it cannot be kept beside
the trial (:func:`keep_stub_config`): a setup without twice's, or an inspect without the
running sample's accessor."""

_CONFIGS: TrialScoped[dict[str, Any]] = TrialScoped()


def keep_stub_config(state: Any, plan: list[dict[str, Any]], prompt: str, seed: str) -> None:
    """Give the stub models of one trial what they read besides the conversation.

    Kept beside the running trial, not in its sample store or metadata: a real model's log
    then carries no stub script, and inspect does not copy and log it at every span (the plan
    in the sample metadata alone cost 3.6% of a bare trial's instructions; see
    docs/BENCHMARKS.md). Where the running sample cannot be found (an inspect without the
    accessor), it goes in the store under :data:`STUB_STORE_KEY` instead.

    Args:
        state: The trial's inspect ``TaskState``.
        plan: The sample's gold plan (the dataset record's ``plan``).
        prompt: The prompt's name (``noisy`` draws its retry rate from it).
        seed: The trial's seed, ``"<sample id>:<epoch>:<prompt>"``.
    """
    config = {"plan": plan, "prompt": prompt, "seed": seed}
    if _sample_state is None:
        store().set(STUB_STORE_KEY, config)
    else:
        _CONFIGS.keep(state, config)


class StubCannotPlay(RunError, RuntimeError):
    """A stub model asked to call a tool of its plan that the agent does not offer.

    Not a finding about the agent: the control cannot play its part, so the trial is an
    error (:func:`raise_if_stub_could_not_play`), never a crashed or clean trial.
    """


def raise_if_stub_could_not_play() -> None:
    """Raise :class:`StubCannotPlay` in a trial where a stub model could not play its plan.

    Agent solvers call this once the agent is done: the stub's own exception reaches the
    agent, which may swallow it, crash with it, or (an ``--agent-cmd`` command) see only an
    HTTP error from the bridge.
    """
    config = current_config()
    refused = config.get("refused") if config else None
    if refused:
        raise StubCannotPlay(refused)


def forget_stub_config(state: Any) -> None:
    """Drop a finished trial's stub config (it goes with the sample at the latest)."""
    _CONFIGS.pop(state)


def current_config() -> dict[str, Any] | None:
    state = _sample_state() if _sample_state is not None else None
    config = _CONFIGS.get(state) if state is not None else None
    return config if config is not None else store().get(STUB_STORE_KEY)


def plan_of(config: dict[str, Any]) -> list[dict[str, Any]]:
    if "plan" in config:
        return config["plan"]  # type: ignore[no-any-return]
    # a hand-written setup that stored only the prompt and seed: the sample metadata's plan
    state = _sample_state() if _sample_state is not None else None
    return list((state.metadata or {}).get("plan", [])) if state is not None else []
