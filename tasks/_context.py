"""Per-trial state of the tool layer, and the per-service handle tools call through."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from inspect_ai.util import store
from twice.mocks import LEDGER_STORE_KEY, Service, Services

from ._action_log import ACTION_LOG_STORE_KEY, COMPENSATIONS_STORE_KEY, ActionLog
from ._declare import ToolSpec, Undo
from ._protections import Protection
from ._send import Lookup, Mutation, mutate, read


@dataclass(frozen=True)
class ServiceAPI:
    """One service as the tools of a trial see it: its base URL and the name messages use.

    Get one with :meth:`TrialContext.api`. Paths are relative to the service's base URL.

    Example:
        >>> payments = ctx.api("payments")
        >>> result = await payments.mutate(
        ...     "payments.refund.create", "/v1/refunds", payload={...},
        ...     identity={"order_id": order_id}, noun="refund")
        >>> return result.say("Created", f"refund {result.body['id']}")
    """

    ctx: TrialContext
    service: Service

    @property
    def label(self) -> str:
        """What messages call the service ("payments API")."""
        return self.service.label

    def url(self, path: str) -> str:
        """The absolute URL of a path on this service."""
        return self.service.base_url + path

    async def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """GET a resource; a failure becomes a ``ToolError`` the model can read."""
        return await read(self.ctx, self.url(path), api=self.label, params=params)

    async def mutate(
        self,
        route: str,
        path: str,
        *,
        payload: dict[str, Any],
        identity: dict[str, Any],
        noun: str,
        lookup: Lookup | None = None,
        method: str = "POST",
        form: bool = False,
        params: dict[str, Any] | None = None,
    ) -> Mutation:
        """Send one mutating request under the trial's protection (see ``mutate``).

        Args:
            route: The effect name (``payments.refund.create``).
            path: The path on this service (``/v1/refunds``).
            payload: JSON body.
            identity: The intent's discriminating fields (``{"order_id": ...}``).
            noun: What gets made, for messages ("refund").
            lookup: Finds an existing effect, for the ``lookup`` protection.
            method: HTTP method.
            form: Send the payload as a form body, not JSON.
            params: Query parameters.

        The idempotency key, when the protection sends one, goes in the header the service
        reads it from (its ``key_header``).
        """
        return await mutate(
            self.ctx,
            route=route,
            method=method,
            url=self.url(path),
            payload=payload,
            identity=identity,
            noun=noun,
            api=self.label,
            lookup=lookup,
            key_header=self.service.key_header,
            form=form,
            params=params,
        )


@dataclass
class TrialContext:
    """Per-trial state of the tool layer: one per sample × epoch.

    Attributes:
        services: The trial's mock services (and ledger).
        protection: The retry policy in force.
        run_id: Stable id of this run of the agent; keys derive from it.
    """

    services: Services
    protection: Protection
    run_id: str = field(default_factory=lambda: f"run_{uuid.uuid4().hex[:12]}")
    calls: int = 0
    intents_seen: set[str] = field(default_factory=set)
    action_log: ActionLog | None = None
    """The durable action log, when the trial keeps one (None: it does not)."""
    compensations: list[Undo] = field(default_factory=list)
    """Undos registered by committed ``compensable`` calls, in order."""
    tool_specs: dict[str, ToolSpec] = field(default_factory=dict)
    """Every tool made for this trial by ``make_tool``, by name."""
    restarts: int = 0
    dispatched: list[tuple[int, str]] = field(default_factory=list)
    """``(call number, intent)`` of every mutating call (to attribute ``resume`` retries)."""
    resume_pending: set[str] = field(default_factory=set)
    """Intents dispatched in a crashed turn and not yet re-sent by the restarted run."""
    repeat_source: str = "model"
    """The retry source of a call repeating an intent already sent: ``model``, or what the
    agent loop last did to the conversation (``user`` once the user asked again,
    ``compaction`` once the context was compacted)."""
    client: httpx.AsyncClient = field(init=False)

    def __post_init__(self) -> None:
        self.client = self.services.client(timeout=httpx.Timeout(10.0))

    def api(self, name: str) -> ServiceAPI:
        """The handle tools call one service through (``ctx.api("payments")``).

        Raises:
            ValueError: naming the unknown service and the trial's services.
        """
        try:
            service = self.services[name]
        except KeyError:
            raise ValueError(
                f"no service {name!r} in this trial; its services: "
                + ", ".join(self.services.services)
            ) from None
        return ServiceAPI(self, service)

    def restart(self, calls: int) -> None:
        """Restart the run from a checkpoint taken when ``calls`` mutating calls had been made.

        The call counter (the step number keys like ``run_id:step`` use) goes back to the
        checkpoint; the action log and registered compensations are durable and stay.
        """
        self.restarts += 1
        self.resume_pending = {intent for n, intent in self.dispatched if n > calls}
        self.calls = calls

    def check_tools(self) -> None:
        """Check that every declared compensation and verify tool is in the toolset.

        Raises:
            ValueError: naming the tool that refers to a missing one, and the tools there are.
        """
        names = sorted(self.tool_specs)
        for spec in self.tool_specs.values():
            refs = [spec.verify_with, spec.compensation.tool if spec.compensation else None]
            for ref in refs:
                if ref is not None and ref not in self.tool_specs:
                    raise ValueError(
                        f"tool {spec.name!r} refers to tool {ref!r}, which is not in the "
                        f"trial's toolset ({', '.join(names)})"
                    )

    def undo_for(self, forward_id: str) -> Undo | None:
        """The registered undo of what a ``compensable`` call made (``fb_1``), if any."""
        return next((u for u in self.compensations if u.forward_id == forward_id), None)

    def register_undo(self, spec: ToolSpec | None, body: dict[str, Any]) -> Undo | None:
        """Register the undo of a committed ``compensable`` call (once per thing made)."""
        if spec is None or spec.compensation is None or "id" not in body:
            return None
        existing = self.undo_for(str(body["id"]))
        if existing is not None:
            return existing
        comp = spec.compensation
        undo = Undo(spec.name, str(body["id"]), comp.tool, comp.args(body))
        self.compensations.append(undo)
        return undo

    def observe(self, text: str) -> str:
        """Record a text the agent is shown (for ``unseen_effects``) and return it."""
        self.services.ledger.observations.append(text)
        return text

    def sync(self) -> None:
        """Copy the ledger (and the action log and compensations) into the sample store.

        The trial's setup registers this with :func:`~twice.mocks.keep_ledger`: it runs once,
        when the trial is over, not after every call.
        """
        store().set(LEDGER_STORE_KEY, self.services.ledger.to_dict())
        if self.action_log is not None:
            store().set(ACTION_LOG_STORE_KEY, self.action_log.to_list())
        if self.compensations:
            store().set(COMPENSATIONS_STORE_KEY, [asdict(u) for u in self.compensations])


TrialContexts = dict[tuple[str | int, int], TrialContext]
"""The live trial contexts of one task, by ``(sample id, epoch)``: how the agent loop finds
the context whose run it restarts."""
