"""The settings every ``eval_set`` of a run shares, and a run made ready to evaluate."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inspect_ai import Task
from twice.reports import Location

from ..suite import DEFAULT_OUTAGE_WINDOW, Cell
from ._endpoint import EndpointState

DEFAULT_TIMEOUT = 300
"""Seconds one attempt of a model call may take (``--timeout``)."""


DEFAULT_MAX_RETRIES = 3
"""Attempts beyond the first that one call makes at an endpoint that has never answered,
before it counts as unreachable (``--max-retries``); once it has answered, the outage window
bounds the retries (``_endpoint``)."""


@dataclass(frozen=True)
class EvalSettings:
    """Inspect settings of every ``eval_set`` a twice run starts (``twice run`` and
    ``--until-decided`` alike): connections, display, retries of an errored eval, and the
    bounds on a model call that end a run whose endpoint is dead."""

    max_connections: int | None = None
    display: str | None = "none"
    retry_attempts: int = 1
    max_retries: int = DEFAULT_MAX_RETRIES
    """Attempts beyond the first of one call, before any succeeded (the endpoint guard's)."""
    timeout: int = DEFAULT_TIMEOUT
    """Seconds one attempt of a model call may take (inspect's ``attempt_timeout``)."""
    generate: dict[str, Any] = field(default_factory=dict)
    """Other inspect generate settings (``temperature``, ``seed``, ``max_tokens``...)."""

    @classmethod
    def of(
        cls,
        generate_config: dict[str, Any] | None = None,
        *,
        max_connections: int | None = None,
        display: str | None = "none",
        retry_attempts: int = 1,
        max_retries: int = DEFAULT_MAX_RETRIES,
        timeout: int = DEFAULT_TIMEOUT,
    ) -> EvalSettings:
        """The settings of a run; ``generate_config`` (a suite's ``[local_model]``) wins for
        ``max_retries`` and ``timeout``, a ``max_connections`` argument wins over its own."""
        generate = dict(generate_config or {})
        if max_connections is None:  # a --max-connections flag wins over the suite's setting
            max_connections = generate.pop("max_connections", None)
        generate.pop("max_connections", None)
        max_retries = int(generate.pop("max_retries", max_retries))
        timeout = int(generate.pop("timeout", timeout))
        generate.pop("attempt_timeout", None)  # always the timeout: one bound per call
        return cls(max_connections, display, retry_attempts, max_retries, timeout, generate)


@dataclass
class PreparedRun:
    """A run ready to evaluate: its tasks (models guarded), its log directory created,
    locked and checked."""

    log_dir: Location
    planned: list[Cell]
    tasks: list[Task]
    guards: dict[str, EndpointState]
    """Endpoint guards by model name (see ``_endpoint``)."""
    outage_window: int = DEFAULT_OUTAGE_WINDOW
    """Seconds an endpoint may fail every call before it counts as unreachable."""

    def unreachable(self) -> list[str]:
        """One line per model whose endpoint was found unreachable."""
        return [g.line() for g in self.guards.values() if g.down]
