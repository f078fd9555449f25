"""One served trial: its services and ledger, its tool layer, and (once used) its MCP
endpoint. Every request that can change it goes through one log-then-serve path."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from twice.assertions import score_trial
from twice.mocks import KEY_HEADER, Services, get_fault
from twice.tasks import (
    ActionLog,
    ActionRecord,
    TaskParts,
    TrialContext,
    Undo,
    get_protection,
    task_parts,
)

from ._config import TrialConfig
from ._upstream import (
    UPSTREAMS_ONLY,
    TrialProxy,
    Upstream,
    replay_upstream,
    upstreams_only_parts,
)

if TYPE_CHECKING:
    from ._mcp import TrialMcp

LOGGED_HEADERS = (
    "content-type",
    KEY_HEADER.lower(),
    "x-twice-source",
    "x-twice-call",
    "x-twice-backoff",
)
"""The only request headers written to the log: the ones the services read. Never
``Authorization``."""


@dataclass
class ServeContext(TrialContext):
    """The tool layer's context of a served trial: what the agent is shown is logged too."""

    on_observe: Callable[[str], None] | None = None

    def observe(self, text: str) -> str:
        if self.on_observe is not None:
            self.on_observe(text)
        self.services.ledger.observations.append(text)
        return text

    def sync(self) -> None:
        """No inspect sample store here: the request log is what keeps the trial."""

    def snapshot(self) -> dict[str, Any]:
        """The tool layer's own state (counters, intents, action log), JSON-ready."""
        return {
            "calls": self.calls,
            "intents_seen": sorted(self.intents_seen),
            "dispatched": [list(d) for d in self.dispatched],
            "resume_pending": sorted(self.resume_pending),
            "restarts": self.restarts,
            "action_log": self.action_log.to_list() if self.action_log is not None else None,
            "compensations": [asdict(u) for u in self.compensations],
        }

    def restore(self, data: dict[str, Any]) -> None:
        """Set the state :meth:`snapshot` returned."""
        self.calls = int(data["calls"])
        self.intents_seen = set(data["intents_seen"])
        self.dispatched = [(int(n), str(i)) for n, i in data["dispatched"]]
        self.resume_pending = set(data["resume_pending"])
        self.restarts = int(data["restarts"])
        if data["action_log"] is not None and self.action_log is not None:
            self.action_log.records = [ActionRecord(**r) for r in data["action_log"]]
        self.compensations = [Undo(**u) for u in data["compensations"]]


def request_record(
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    read: Collection[str] = (),
) -> dict[str, Any]:
    """What the log keeps of one service request: the headers the services read (twice's own,
    and ``read``: the lowercase names a service declares), never an Authorization header."""
    return {
        "method": method,
        "url": url,
        "headers": {
            k: v
            for k, v in headers.items()
            if (k.lower() in LOGGED_HEADERS or k.lower() in read) and k.lower() != "authorization"
        },
        # latin-1 maps every byte to one character: any body survives JSON unchanged.
        "body": body.decode("latin-1"),
        # When it arrived: a replay keeps it, so a rebuilt ledger orders its attempts against
        # the model's turns as the first one did.
        "at": time.time(),
    }


@dataclass
class ServedTrial:
    """One trial: its services and ledger, its tool layer, and (once used) its MCP endpoint."""

    id: str
    config: TrialConfig
    parts: TaskParts
    metadata: dict[str, Any]
    services: Services
    ctx: ServeContext
    log: Callable[[str, dict[str, Any]], None]
    mcp: TrialMcp | None = None
    proxy: TrialProxy | None = None
    """Its upstreams (``twice serve --upstream``), when the server has any."""
    _tools: list[Any] = field(default_factory=list)

    @classmethod
    def create(
        cls,
        trial_id: str,
        config: TrialConfig,
        log: Callable[[str, dict[str, Any]], None],
        upstreams: Sequence[Upstream] = (),
        upstream_client: Callable[[], httpx.AsyncClient] | None = None,
    ) -> ServedTrial:
        """Build a trial from its sample's initial state; ``upstreams`` (reached with
        ``upstream_client``) answer in place of any mock service of the same name."""
        parts = upstreams_only_parts() if config.task == UPSTREAMS_ONLY else task_parts(config.task)
        sample = next((s for s in parts.dataset if str(s.id) == config.sample), None)
        if sample is None:
            raise ValueError(f"task {config.task!r} has no sample {config.sample!r}")
        metadata = dict(sample.metadata or {})
        if config.intents is not None:
            metadata["intents"] = config.intents
        services = Services(
            parts.services(metadata.get("state", {})), fault=get_fault(config.fault)
        )
        protection = get_protection(config.protection)
        ctx = ServeContext(
            services,
            protection,
            run_id=f"run_{trial_id}",
            action_log=ActionLog() if protection.action_log else None,
        )
        trial = cls(trial_id, config, parts, metadata, services, ctx, log)
        ctx.on_observe = lambda text: log("observe", {"text": text})
        # The tool layer's requests go through the same log-then-serve path as HTTP clients'.
        ctx.client = httpx.AsyncClient(
            transport=httpx.MockTransport(trial.tool_request), timeout=httpx.Timeout(10.0)
        )
        trial._tools = parts.tools(ctx)
        ctx.check_tools()
        if upstreams and upstream_client is not None:
            trial.proxy = TrialProxy(upstreams, services, log, upstream_client)
        return trial

    def replay_upstream(self, data: dict[str, Any]) -> None:
        """Put a logged forward back into the ledger (a restart forwards nothing again)."""
        if self.proxy is not None:
            self.proxy.replay(data)
        else:
            replay_upstream(self.services, data)

    def apply(self, record: dict[str, Any]) -> httpx.Response:
        """Serve a logged request (live or replayed); raises the fault's transport error."""
        request = httpx.Request(
            record["method"],
            record["url"],
            # As bytes: httpx encodes str values as ASCII, and a client's header need not be
            # (a non-ASCII Idempotency-Key is the key rules' 400, not a 500 here).
            headers=[
                (k.encode("latin-1"), v.encode("latin-1")) for k, v in record["headers"].items()
            ],
            content=record["body"].encode("latin-1"),
        )
        ledger = self.services.ledger
        before = len(ledger.attempts)
        try:
            return self.services.dispatch(request)
        finally:
            if "at" in record:
                for attempt in ledger.attempts[before:]:
                    attempt.at = record["at"]

    def serve(self, record: dict[str, Any]) -> httpx.Response:
        """Log a request, then serve it: nothing is answered that is not in the log."""
        self.log("request", record)
        return self.apply(record)

    async def tool_request(self, request: httpx.Request) -> httpx.Response:
        """The tool layer's transport (MCP tool calls): the same log-then-serve path, or the
        same forward as an HTTP client's for a service an upstream stands in for."""
        if self.proxy is not None:
            forwarded = self._forward_tool(self.proxy, request)
            if forwarded is not None:
                return await forwarded
        return self.serve(
            request_record(request.method, str(request.url), dict(request.headers), request.content)
        )

    def _forward_tool(
        self, proxy: TrialProxy, request: httpx.Request
    ) -> Coroutine[Any, Any, httpx.Response] | None:
        """The forward of a tool's request to a mock service an upstream replaces (None for
        another service): the tools then act on the real service, under the same fault."""
        url = str(request.url)
        for name in proxy.upstreams:
            mock = self.services.services.get(name)
            if mock is None or not url.startswith(mock.base_url):
                continue
            rest = url[len(mock.base_url) :]
            if rest[:1] not in ("", "/", "?"):  # another host that merely starts alike
                continue
            path, _, query = rest.partition("?")
            headers = list(request.headers.multi_items())
            return proxy.forward(name, request.method, path or "/", query, headers, request.content)
        return None

    def mcp_endpoint(self) -> TrialMcp:
        """The trial's MCP endpoint, made on first use."""
        if self.mcp is None:
            # Imported here: mcp is an optional extra ("twice[serve]"), needed only for MCP.
            from ._mcp import TrialMcp

            self.mcp = TrialMcp(
                f"twice-{self.config.task}",
                self._tools,
                self.ctx.tool_specs,
                self.config.protection,
                lambda: self.log("context", self.ctx.snapshot()),
            )
        return self.mcp

    def verdict(self) -> dict[str, Any]:
        """The task's per-trial metrics, from the same code the scorer uses."""
        m = score_trial(self.services.ledger, self.metadata, self.parts.end_state)
        return {
            "id": self.id,
            "task": self.config.task,
            "sample": self.config.sample,
            "fault": self.config.fault,
            "protection": self.config.protection,
            "metrics": m.values(),
            "explanation": m.explanation(),
            "evidence": m.evidence(),
        }
