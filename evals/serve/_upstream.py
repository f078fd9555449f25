"""``twice serve --upstream NAME=URL``: a trial's requests to ``/t/<id>/NAME/...`` forwarded to
a real service (the user's staging), with the trial's fault applied around the real call.

The fault's two hooks run around the forward as they run around a mock's commit point:
``before_commit`` first (``timeout_before_commit``, ``error_before_commit`` and
``rate_limited`` answer without forwarding: nothing reaches the upstream); then the request
goes to the upstream with its method, path, query, body and the client's own headers
(credentials included: the upstream needs them); then ``after_commit`` gets the upstream's
real reply and may withhold it (``lost_reply``: the reply is held open until the client
times out; ``reset_after_commit``: the connection is closed) or replace it
(``error_after_commit``: a 502 from the gateway twice plays). A fault the upstream itself would
have to save (``server_error_after_commit``) acts as a gateway's error here: the upstream's
idempotency store is its own.

The ledger records every forwarded request as an :class:`~twice.mocks.Attempt` with the
upstream's status and JSON body (``Attempt.reply``). A 2xx answer to a mutating request is an
:class:`~twice.mocks.Effect` named by the route of the task's mock service of the same name
when it has one (``payments.refund.create``), else ``NAME.<resource>.<verb>`` inferred the REST
way; its id is the reply's ``id`` and its fields the request's parameters overlaid with the
reply's. A reply the upstream marks ``Idempotent-Replayed: true``, or one that returns the id an
earlier attempt with the same Idempotency-Key already made, is a replay: no new effect.

Only loopback upstreams are forwarded to unless the user names the host
(``--upstream-allow HOST``); redirects are never followed, so an upstream cannot send twice
elsewhere. Headers are passed through but never written to the ledger or the request log.
"""

from __future__ import annotations

import contextlib
import json
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx
from inspect_ai.dataset import MemoryDataset, Sample
from twice.mocks import (
    BACKOFF_HEADER,
    CALL_HEADER,
    KEY_HEADER,
    REPLAYED_HEADER,
    SOURCE_HEADER,
    Attempt,
    Effect,
    Services,
    error_response,
    outcome_of,
)
from twice.tasks import CREDENTIAL_ARG, REDACTED, TaskParts

from ._errors import ServeError
from ._guard import is_loopback

UPSTREAMS_ONLY = "upstreams"
"""The ``task`` of a trial made with no task on a server with upstreams: no mock services,
no tools, one sample with no state; its trial config's ``intents`` say what should happen."""
UPSTREAM_TIMEOUT = 30.0
"""Seconds the proxy waits for an upstream's reply before answering the client 504."""
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_VERSION = re.compile(r"v\d+(\.\d+)*|api")
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
"""Request headers the proxy does not pass on: they describe the client's hop, not the
request (httpx sets the upstream's own ``Host`` and ``Content-Length``)."""
_REPLY_DROPPED = _HOP_BY_HOP | {"content-encoding", "server", "date"}
"""Reply headers not passed back: httpx has already decoded the body, so its encoding no
longer applies, and the proxy's own server sets ``server`` and ``date``."""


@dataclass(frozen=True)
class Upstream:
    """One ``--upstream NAME=URL``: the trial service ``NAME`` forwards to ``url``."""

    name: str
    url: str


def parse_upstreams(specs: Iterable[str], allow: Iterable[str] = ()) -> tuple[Upstream, ...]:
    """Validate ``--upstream NAME=URL`` options against the ``--upstream-allow`` hosts.

    Args:
        specs: ``NAME=URL`` strings.
        allow: Hosts other than loopback an upstream may be on.

    Raises:
        ServeError: naming the bad value and what is accepted: a spec without ``=``, a bad or
            repeated name, a URL that is not ``http(s)://HOST[:PORT][/PATH]``, or a host that
            is neither loopback nor allowed.
    """
    allowed = {h.strip().lower().strip("[]") for h in allow}
    seen: dict[str, Upstream] = {}
    for spec in specs:
        name, sep, url = spec.partition("=")
        name, url = name.strip(), url.strip()
        if not sep or not url:
            raise ServeError(
                f"--upstream {spec!r} is not NAME=URL (e.g. payments=http://127.0.0.1:8000)"
            )
        if not _NAME.fullmatch(name) or name == "mcp":
            raise ServeError(
                f"--upstream name {name!r} is not a service name: lower-case letters, digits, "
                "'_' and '-', starting with a letter (and not 'mcp', the trial's MCP endpoint)"
            )
        if name in seen:
            raise ServeError(f"--upstream {name!r} is given twice; give each name one URL")
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
        except ValueError:
            parts = None
        if (
            parts is None
            or parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.query
            or parts.fragment
            or "@" in parts.netloc
        ):
            raise ServeError(
                f"--upstream {name}={url!r}: the URL must be http(s)://HOST[:PORT][/PATH], "
                "with no user, query or fragment"
            )
        host = parts.hostname.lower()
        if not is_loopback(host) and host not in allowed:
            raise ServeError(
                f"--upstream {name}={url}: host {host!r} is not loopback; twice forwards a "
                f"trial's requests (and their credentials) only to loopback or to a host you "
                f"name: add --upstream-allow {host}"
            )
        seen[name] = Upstream(name, url.rstrip("/"))
    return tuple(seen.values())


def upstreams_only_parts() -> TaskParts:
    """The parts of an :data:`UPSTREAMS_ONLY` trial: its services are the upstreams alone."""
    return TaskParts(
        name=UPSTREAMS_ONLY,
        dataset=MemoryDataset([Sample(id=UPSTREAMS_ONLY, input="", metadata={})]),
        services=lambda state: [],
        tools=lambda ctx: [],
        end_state=None,
    )


def _singular(word: str) -> str:
    if word.endswith("ies") and len(word) > 3:
        return word[:-3] + "y"
    if word.endswith("s") and not word.endswith("ss") and len(word) > 1:
        return word[:-1]
    return word


def _clean(word: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", word.lower()) or "resource"


def infer_route(service: str, method: str, path: str) -> str:
    """The effect name of a request to an API twice knows nothing of, the usual REST way.

    ``POST /v1/refunds`` → ``payments.refund.create``; ``GET`` on it → ``.list``; an item
    (``/v1/refunds/re_1``) is ``get``, ``update`` (PUT, PATCH, or POST as Stripe does) or
    ``delete``; a POST on an item's sub-path is an action (``/v1/refunds/re_1/cancel`` →
    ``payments.refund.cancel``). A leading version segment (``v1``, ``api``) is left out.
    """
    segments = [urllib.parse.unquote(s) for s in path.split("/") if s]
    while segments and _VERSION.fullmatch(segments[0]):
        segments = segments[1:]
    if not segments:
        return f"{service}.root.{method.lower()}"
    if len(segments) % 2 == 1:
        if len(segments) >= 3 and method == "POST":
            return f"{service}.{_clean(_singular(segments[-3]))}.{_clean(segments[-1])}"
        verb = {"POST": "create", "GET": "list"}.get(method, method.lower())
        return f"{service}.{_clean(_singular(segments[-1]))}.{verb}"
    verb = {"GET": "get", "DELETE": "delete"}.get(method, "update")
    return f"{service}.{_clean(_singular(segments[-2]))}.{verb}"


def _params(query: str, content_type: str, body: bytes) -> dict[str, Any]:
    """The request's parameters: query, then a form or JSON object body."""
    params: dict[str, Any] = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    if not body:
        return params
    if content_type.startswith("application/x-www-form-urlencoded"):
        with contextlib.suppress(UnicodeDecodeError):  # a body that is no form: no params
            params.update(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
        return params
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return params
    if isinstance(data, dict):
        params.update(data)
    return params


MIN_CREDENTIAL_CHARS = 8
"""Shorter values are not scrubbed: replacing every "1" or "true" would garble the record."""


def credentials_of(headers: Sequence[tuple[str, str]], params: Mapping[str, Any]) -> set[str]:
    """The credentials a request carries: the values of its credential headers
    (``Authorization``, ``Cookie``, ``X-Api-Key``...; a scheme's token on its own too) and of
    its credential parameters (``?api_key=``, ``"token"``...)."""
    found: set[str] = set()
    named = [(k, v) for k, v in headers] + [(k, v) for k, v in params.items() if isinstance(v, str)]
    for name, value in named:
        if CREDENTIAL_ARG.search(name) and name.lower() != KEY_HEADER.lower():
            found.add(value.strip())
            found.update(value.split()[1:])  # "Bearer TOKEN": the token alone too
    return {v for v in found if len(v) >= MIN_CREDENTIAL_CHARS}


def scrub(value: Any, secrets: set[str]) -> Any:
    """``value`` (JSON) with every credential in ``secrets`` replaced, inside strings too."""
    if not secrets:
        return value
    if isinstance(value, str):
        # Longest first: a token inside a longer credential ("Bearer TOKEN") would otherwise
        # leave the rest of that one behind, depending on the set's order.
        for secret in sorted(secrets, key=len, reverse=True):
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {k: scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    return value


def _json_body(response: httpx.Response) -> Any:
    """The reply's body as JSON, or as text when it is not JSON (None when empty)."""
    if not response.content:
        return None
    try:
        return response.json()
    except (ValueError, RecursionError):
        return response.content.decode("utf-8", "replace")


class TrialProxy:
    """The upstreams of one trial: forwards its requests, applies its fault, keeps its ledger.

    Args:
        upstreams: The server's upstreams.
        services: The trial's services (their ledger and fault; a mock service named like an
            upstream names its effects).
        log: Writes one record of the trial's request log.
        client: The httpx client that reaches the upstreams (one per server).
    """

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        services: Services,
        log: Callable[[str, dict[str, Any]], None],
        client: Callable[[], httpx.AsyncClient],
    ) -> None:
        self.upstreams = {u.name: u for u in upstreams}
        self.services = services
        self.ledger = services.ledger
        # Effects of an API twice knows nothing of are named from its paths: an intent on
        # one of them is not a typo twice could catch.
        self.ledger.known_effects = None
        self._log = log
        self._client = client
        self.secrets: set[str] = set()
        """The credentials the trial's requests carried (in memory only): scrubbed from all it
        records, the texts the agent was shown included."""
        self.hits = services.hits
        """The trial's fault and the attempts it hits, shared with its mock services: a
        schedule counts the trial's mutating attempts wherever they go, and a hit one of them
        could not take passes to the next, mock or upstream."""

    def route_of(self, name: str, method: str, path: str) -> tuple[str, bool]:
        """The request's effect name and whether it mutates: from the task's mock service of
        the same name when one of its routes matches, else inferred (:func:`infer_route`)."""
        mock = self.services.services.get(name)
        if mock is not None:
            for route in mock.routes():
                if route.method == method and re.fullmatch(route.path + "/?", path):
                    return route.name, route.mutating
        return infer_route(name, method, path), method in MUTATING_METHODS

    def _replay_of(self, attempt: Attempt, response: httpx.Response, object_id: str | None) -> bool:
        if response.headers.get(REPLAYED_HEADER, "").lower() == "true":
            return True
        if attempt.key is None or object_id is None:
            return False
        return any(
            e.id == object_id and self.ledger.attempt(e.attempt).key == attempt.key
            for e in self.ledger.effects
        )

    async def forward(
        self,
        name: str,
        method: str,
        path: str,
        query: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> httpx.Response:
        """Forward one request to upstream ``name`` under the trial's fault.

        Returns:
            The reply the client gets.

        Raises:
            httpx.TimeoutException: the fault loses the reply (the caller holds it open).
            httpx.TransportError: the fault resets the connection (the caller closes it).
        """
        upstream = self.upstreams[name]
        sent = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP]
        lower = {k.lower(): v for k, v in headers}
        url = upstream.url + path + (f"?{query}" if query else "")
        request = httpx.Request(
            method,
            url,
            headers=[(k.encode("latin-1"), v.encode("latin-1")) for k, v in sent],
            content=body,
        )
        route, mutating = self.route_of(name, method, path)
        params = _params(query, lower.get("content-type", ""), body)
        self.secrets |= credentials_of(headers, params)
        call = lower.get(CALL_HEADER.lower())
        try:
            backoff = float(lower.get(BACKOFF_HEADER.lower(), 0) or 0)
        except ValueError:
            backoff = 0.0
        attempt = Attempt(
            n=len(self.ledger.attempts) + 1,
            service=name,
            method=method,
            path=path,
            route=route,
            mutating=mutating,
            key=lower.get(KEY_HEADER.lower()),
            params=scrub(params, self.secrets),
            source=lower.get(SOURCE_HEADER.lower(), "unknown"),
            call=int(call) if call and call.isdigit() else None,
            backoff=backoff,
        )
        self.ledger.attempts.append(attempt)
        effects: list[Effect] = []
        try:
            return await self._around(attempt, request, effects)
        finally:
            # After the upstream answered and before the client is: a restart rebuilds the
            # ledger from this record, never by forwarding again.
            self._log(
                "upstream",
                {
                    "attempt": asdict(attempt),
                    "effects": [asdict(e) for e in effects],
                    "deferred": self.hits.deferred,
                },
            )

    async def _around(
        self, attempt: Attempt, request: httpx.Request, effects: list[Effect]
    ) -> httpx.Response:
        """The fault's hooks around the real call."""
        fault = self.hits.hit(attempt)
        if fault is not None:
            try:
                early = fault.before_commit(request)
            except httpx.TransportError:
                self._finish(attempt, None, delivered=False)
                raise
            if early is not None:
                self._finish(attempt, early)
                return early
        try:
            response = await self._client().send(request, follow_redirects=False)
        except httpx.HTTPError as ex:
            # Whether the upstream did the work is unknown to twice too: told as a gateway's
            # error, never as the fault, which passes to the next attempt instead.
            if isinstance(ex, httpx.TimeoutException):
                why = f"did not answer within {UPSTREAM_TIMEOUT:g} s"
                reply = error_response(504, f"the {attempt.service} upstream {why}", "api_error")
            else:
                why = f"cannot be reached: {type(ex).__name__}"
                reply = error_response(502, f"the {attempt.service} upstream {why}", "api_error")
            self._finish(attempt, reply)
            if fault is not None:
                self.hits.defer(attempt, fault)
            return reply
        # An upstream may echo a credential (a 401 naming the key): never recorded.
        attempt.reply = scrub(_json_body(response), self.secrets)
        status = response.status_code
        if 200 <= status < 300 and attempt.mutating:
            self._commit(attempt, response, effects)
        if fault is not None and fault.commits and 400 <= status < 500:
            # The upstream refused it: no work to lose a reply after.
            self.hits.defer(attempt, fault)
            fault = None
        out = httpx.Response(
            status,
            content=response.content,
            headers=[
                (k, v) for k, v in response.headers.multi_items() if k.lower() not in _REPLY_DROPPED
            ],
        )
        if fault is not None:
            try:
                out = fault.after_commit(request, out)
            except httpx.TransportError:
                self._finish(attempt, response, delivered=False)
                raise
        self._finish(attempt, out)
        return out

    def _commit(self, attempt: Attempt, response: httpx.Response, effects: list[Effect]) -> None:
        """Record the effect a 2xx answer to a mutating request made (none for a replay)."""
        reply = attempt.reply if isinstance(attempt.reply, dict) else {}
        given = reply.get("id")
        object_id = (
            str(given) if isinstance(given, str | int) and not isinstance(given, bool) else None
        )
        if self._replay_of(attempt, response, object_id):
            attempt.replayed = True
            return
        fields = {**attempt.params, **{k: v for k, v in reply.items() if k != "id"}}
        effect = Effect(
            id=object_id or f"{attempt.service}_{attempt.n}",
            name=attempt.route or attempt.service,
            attempt=attempt.n,
            fields=fields,
        )
        self.ledger.effects.append(effect)
        attempt.effect_ids.append(effect.id)
        effects.append(effect)

    @staticmethod
    def _finish(attempt: Attempt, response: httpx.Response | None, delivered: bool = True) -> None:
        attempt.status = None if response is None else response.status_code
        attempt.delivered = delivered
        attempt.outcome = outcome_of(attempt.status, delivered)

    def replay(self, data: Mapping[str, Any]) -> None:
        """Put back what a logged forward recorded (on a restart: nothing is forwarded)."""
        replay_upstream(self.services, data)


def replay_upstream(services: Services, data: Mapping[str, Any]) -> None:
    """Put a logged forward back into a trial's ledger (a trial restored on a server that no
    longer has that upstream keeps what it recorded)."""
    ledger = services.ledger
    ledger.known_effects = None
    # A forward is logged when its upstream has answered, so one that overlapped a quicker
    # request of the trial is logged after it: put back in the order the attempts were made.
    attempt = Attempt(**data["attempt"])
    ledger.attempts.append(attempt)
    ledger.attempts.sort(key=lambda a: a.n)
    # The fault's count and owed hits as they stood after this forward, so the trial's next
    # attempt (mock or upstream) meets the fault it met before the restart.
    services.hits.count(attempt)
    services.hits.deferred = int(data["deferred"])
    ledger.effects.extend(Effect(**e) for e in data["effects"])
    ledger.effects.sort(key=lambda e: e.attempt)
