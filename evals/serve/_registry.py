"""The trials a server holds, kept durable by the write-ahead request log.

Every request that can change a trial is written ahead to SQLite (WAL) before it is served;
on start the server replays that log, so after ``kill -9`` every trial comes back exactly as
it was (the services are deterministic).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import httpx
from twice.tasks import TASKS, task_parts

from ..suite import DEFAULT_HANG_SECONDS
from ._config import TrialConfig
from ._errors import ServeError
from ._log import RequestLog
from ._trial import ServedTrial
from ._upstream import UPSTREAM_TIMEOUT, UPSTREAMS_ONLY, Upstream


def own_tasks(tasks: Sequence[str]) -> tuple[str, ...]:
    """The tasks of your own among ``tasks`` (``path.py:function``), each loaded and built.

    Raises:
        ServeError: naming a task that cannot be loaded or was not built with ``twice_task``.
    """
    own = tuple(dict.fromkeys(t for t in tasks if t not in TASKS))
    for spec in own:
        try:
            task_parts(spec)
        except ValueError as ex:
            raise ServeError(f"--task {spec!r}: {ex}") from None
    return own


class TrialRegistry:
    """The trials of one server by id, rebuilt from its request log at once.

    Args:
        log: The write-ahead request log.
        base_url: ``http://HOST:PORT`` as clients reach the server (trial URLs start with it).
        tasks: Tasks of your own (``path.py:function``) trials may be made of, beside the
            built-in ones; each is loaded and built here.
        hang_seconds: How long a trial that gives no ``hang_seconds`` holds a lost reply open.
        upstreams: Real services each trial's requests to their name are forwarded to.

    Raises:
        ServeError: for a task of your own that cannot be loaded, or a logged trial of a task
            this server does not have.
    """

    def __init__(
        self,
        log: RequestLog,
        base_url: str,
        tasks: Sequence[str] = (),
        hang_seconds: float = DEFAULT_HANG_SECONDS,
        upstreams: Sequence[Upstream] = (),
    ) -> None:
        self.request_log = log
        self.hang_seconds = hang_seconds
        self.base_url = base_url.rstrip("/")
        self.tasks = own_tasks(tasks)
        self.upstreams = tuple(upstreams)
        self._upstream_client: httpx.AsyncClient | None = None
        self.trials: dict[str, ServedTrial] = {}
        self.replayed = self._replay()
        self._closed = False

    def upstream_client(self) -> httpx.AsyncClient:
        """The one client that reaches the upstreams, made on first use (in the server's
        event loop). It takes no proxy from the environment: the upstream is the one named."""
        if self._upstream_client is None:
            self._upstream_client = httpx.AsyncClient(
                timeout=httpx.Timeout(UPSTREAM_TIMEOUT), trust_env=False, follow_redirects=False
            )
        return self._upstream_client

    def _new_trial(self, trial_id: str, config: TrialConfig) -> ServedTrial:
        return ServedTrial.create(
            trial_id, config, self._logger(trial_id), self.upstreams, self.upstream_client
        )

    def _logger(self, trial_id: str) -> Callable[[str, dict[str, Any]], None]:
        def write(kind: str, data: dict[str, Any]) -> None:
            self.request_log.append(trial_id, kind, data)

        return write

    def _replay(self) -> int:
        """Rebuild every trial from the log; returns the number of records replayed."""
        n = 0
        for record in self.request_log.records():
            n += 1
            if record.kind == "create":
                self.trials[record.trial] = self._recreate(record.trial, record.data)
                continue
            trial = self.trials.get(record.trial)
            if trial is None:
                continue
            if record.kind == "request":
                # A fault's error (a lost reply) happened the same way when it was first served.
                with contextlib.suppress(Exception):
                    trial.apply(record.data)
            elif record.kind == "upstream":
                trial.replay_upstream(record.data)
            elif record.kind == "observe":
                trial.services.ledger.observations.append(record.data["text"])
            elif record.kind == "context":
                trial.ctx.restore(record.data)
            elif record.kind == "delete":
                del self.trials[record.trial]
        return n

    def _recreate(self, trial_id: str, logged: dict[str, Any]) -> ServedTrial:
        """A logged trial, built again from its sample."""
        # A log of an older twice may hold the retired lost_reply mode: the services'
        # state never depended on it.
        config = TrialConfig(**{k: v for k, v in logged.items() if k != "lost_reply"})
        if config.task not in (*TASKS, *self.tasks, UPSTREAMS_ONLY):
            raise ServeError(
                f"{self.request_log.path} cannot be replayed: trial {trial_id} is "
                f"of task {config.task!r}, a task of your own; start the server with "
                f"--task {config.task}"
            )
        try:
            return self._new_trial(trial_id, config)
        except ValueError as ex:
            raise ServeError(
                f"{self.request_log.path} cannot be replayed: trial {trial_id} "
                f"was made from something this twice does not have ({ex})"
            ) from None

    def create_trial(self, config: TrialConfig) -> dict[str, Any]:
        """Make a trial (logged first) and return its id and URLs."""
        trial_id = secrets.token_hex(8)
        self.request_log.append(trial_id, "create", asdict(config))
        trial = self._new_trial(trial_id, config)
        self.trials[trial_id] = trial
        return self.describe(trial)

    async def delete_trial(self, trial: ServedTrial) -> None:
        """Forget a trial (logged first)."""
        self.request_log.append(trial.id, "delete", {})
        del self.trials[trial.id]
        if trial.mcp is not None:
            await trial.mcp.stop()

    def describe(self, trial: ServedTrial) -> dict[str, Any]:
        """A trial's id, configuration and URLs."""
        base = f"{self.base_url}/t/{trial.id}"
        names = [*trial.services.services]
        if trial.proxy is not None:
            names += [n for n in trial.proxy.upstreams if n not in names]
        urls = {name: f"{base}/{name}" for name in names}
        urls["mcp"] = f"{base}/mcp"
        return {"id": trial.id, **asdict(trial.config), "urls": urls}

    async def close(self) -> None:
        """Stop every MCP endpoint, then close the request log (folding its WAL into the
        ``--db`` file and letting go of its lock). Once: later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            for trial in self.trials.values():
                if trial.mcp is not None:
                    await trial.mcp.stop()
            if self._upstream_client is not None:
                await self._upstream_client.aclose()
        finally:
            self.request_log.close()
