"""Services as respx routes, bound per trial.

A :class:`Service` declares routes (method, path, ``service.resource.verb`` name, handler).
A :class:`Services` set binds several services to one trial: one ledger, one fault, and an
httpx transport. Nothing is patched globally, so trials running concurrently never see each
other's state.

The respx router is built once per *layout* (which services, at which base URLs, with which
routes) and shared by every trial with that layout: building one cost more than the rest of a
stub trial's service work. The transport binds the trial's :class:`Services` to each request
(a context variable, set for the duration of the request), and the router's side effects
dispatch to the bound set.

Every request goes through one pipeline: record the attempt, apply the idempotency-key rules,
run the fault's ``before_commit`` hook, let other requests in (the "in flight" window), run the
handler (which commits effects), save the keyed response, run the fault's ``after_commit`` hook.

The steps between two in-flight windows run under one lock per :class:`Services`, so blocking
clients on several threads (and an event loop beside them) see one request at a time: attempt
numbers stay unique and a fault's schedule counts every attempt exactly once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import inspect
import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx
import respx

from ._faults import Fault, NoFault
from ._idempotency import MAX_KEY_LENGTH, IdempotencyStore, fingerprint
from ._ledger import Attempt, Effect, Ledger, outcome_of

SOURCE_HEADER = "X-Twice-Source"
"""Request header naming the retry source of an attempt (see :data:`RETRY_SOURCES`)."""
CALL_HEADER = "X-Twice-Call"
"""Request header carrying the tool layer's call number."""
BACKOFF_HEADER = "X-Twice-Backoff"
"""Request header carrying the virtual seconds the client waited before this attempt."""
KEY_HEADER = "Idempotency-Key"
FORM_TYPE = "application/x-www-form-urlencoded"
REPLAYED_HEADER = "Idempotent-Replayed"
"""Response header set to ``true`` on a response replayed from the idempotency store (Stripe's
name): the client can tell "this call made it" from "an earlier request with this key did"."""


def error_response(
    status: int, message: str, type: str = "invalid_request_error"
) -> httpx.Response:
    """A JSON error body in the Stripe shape: ``{"error": {"type", "message"}}``."""
    return httpx.Response(status, json={"error": {"type": type, "message": message}})


_JSON_TYPES = {dict: "an object", list: "an array", float: "a number", bool: "a boolean"}


def not_found(kind: str, param: str, value: Any) -> httpx.Response:
    """The answer to a body parameter that names nothing: 404 ``No such <kind>: 'x'`` for an
    id that names nothing, 400 naming ``param`` for a missing value or one that is no id at
    all (a JSON array or object: "No such product: ['a']" read like a lookup that failed)."""
    if value is None or value == "":
        return error_response(400, f"Missing required param: {param}")
    if not isinstance(value, str | int) or isinstance(value, bool):
        what = _JSON_TYPES.get(type(value), type(value).__name__)
        return error_response(400, f"Invalid {param}: must be a string id, got {what}")
    return error_response(404, f"No such {kind}: {str(value)!r}")


class Call:
    """What a route handler gets: the parsed request and a way to commit effects."""

    def __init__(
        self,
        service: Service,
        request: httpx.Request,
        params: dict[str, Any],
        attempt: Attempt,
    ) -> None:
        self.service = service
        self.request = request
        self.params = params
        self.attempt = attempt

    def commit(self, name: str, prefix: str, fields: dict[str, Any]) -> Effect:
        """Record a committed state change; returns the effect with a fresh id (``re_1``).

        Raises:
            ValueError: when ``name`` is not the route's own name: intents, the scorer and
                the idempotency classes all know an effect by the route that makes it, so an
                effect under another name would count for nothing.
        """
        if name != self.attempt.route:
            raise ValueError(
                f"{type(self.service).__name__}: the handler of route {self.attempt.route!r} "
                f"committed an effect named {name!r}; a route commits effects under its own "
                f"name (call.commit({self.attempt.route!r}, ...))"
            )
        effect = Effect(
            id=self.service.next_id(prefix),
            name=name,
            attempt=self.attempt.n,
            fields=dict(fields),
        )
        self.service.ledger.effects.append(effect)
        self.attempt.effect_ids.append(effect.id)
        return effect


Handler = Callable[[Call], httpx.Response]


@dataclass(frozen=True)
class Route:
    """One endpoint of a service."""

    method: str
    path: str
    """A regular expression for the path, relative to the service's base URL; named groups
    become parameters."""
    name: str
    """``service.resource.verb``; also the respx route name and the effect name it commits."""
    handler: Handler
    mutating: bool = False


class Service:
    """Base class of a fake HTTP API. State lives on the instance: make one per trial."""

    name: ClassVar[str] = "service"
    default_base_url: ClassVar[str] = "https://service.twice.test"
    idempotency_keys: ClassVar[bool] = True
    """Whether the service honours Idempotency-Key on its mutating POST routes. A service
    without key support ignores the header entirely (it is still recorded on the attempt)."""
    api_name: ClassVar[str | None] = None
    """What messages call the service ("helpdesk API"); None: ``"<name> API"``."""

    def __init__(self, base_url: str | None = None) -> None:
        self.base_url = _normal_base_url(base_url or self.default_base_url)
        self.keys = IdempotencyStore()
        self._counters: dict[str, int] = {}
        self._services: Services | None = None

    def routes(self) -> list[Route]:
        """The service's endpoints."""
        raise NotImplementedError

    @property
    def label(self) -> str:
        """What messages call the service: ``api_name``, else ``"<name> API"``."""
        return self.api_name or f"{self.name} API"

    @property
    def ledger(self) -> Ledger:
        """The ledger of the trial this service belongs to."""
        if self._services is None:
            raise RuntimeError(f"{type(self).__name__} is not part of a Services set yet")
        return self._services.ledger

    def next_id(self, prefix: str) -> str:
        """``re_1``, ``re_2``, ...: ids are per service and per trial, so runs repeat exactly."""
        n = self._counters.get(prefix, 0) + 1
        self._counters[prefix] = n
        return f"{prefix}_{n}"


@functools.lru_cache(maxsize=256)
def _state_owners(kinds: tuple[type[Service], ...]) -> dict[str, type[Service]]:
    """Which of ``kinds`` takes each state key. Worked out once per set of service classes
    (a trial's setup builds its services from state every time); callers must not change
    the returned dict."""
    owner: dict[str, type[Service]] = {}
    for kind in kinds:
        for name, param in inspect.signature(kind).parameters.items():
            if name == "base_url" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            if name in owner:
                raise ValueError(
                    f"state key {name!r} is taken by both {owner[name].__name__} and "
                    f"{kind.__name__}; give one of them another constructor argument"
                )
            owner[name] = kind
    return owner


@functools.lru_cache(maxsize=256)
def _normal_base_url(url: str) -> str:
    # Normalised as httpx normalises a request's URL (lowercase host, no default port), so a
    # base URL written "https://API.example.com" still matches the requests sent to it.
    # Cached: every trial makes its services afresh, mostly with the same few URLs.
    return str(httpx.URL(url)).rstrip("/")


def services_from_state(state: Mapping[str, Any], *kinds: type[Service]) -> list[Service]:
    """Build a trial's services from a sample's ``state``: each key goes to the service whose
    constructor takes it (``{"orders": [...]}`` → ``PaymentsService(orders=[...])``).

    Args:
        state: The sample's starting state, keyed by constructor argument.
        kinds: The service classes of the trial.

    Raises:
        ValueError: for a key no service takes (a misspelt key must not give an empty
            service), naming it and the accepted keys; or a key two services take.
    """
    owner = _state_owners(kinds)
    unknown = sorted(set(state) - set(owner))
    if unknown:
        names = ", ".join(k.__name__ for k in kinds)
        raise ValueError(
            f"unknown state key(s) {', '.join(map(repr, unknown))} for {names}; accepted: "
            + ", ".join(sorted(owner))
        )
    return [kind(**{k: v for k, v in state.items() if owner[k] is kind}) for kind in kinds]


def _params(
    request: httpx.Request, path_params: dict[str, str]
) -> tuple[dict[str, Any], str | None]:
    """The request's parameters (query, then form or JSON body, then path), and why its body
    could not be read as parameters (None when it could, or is empty): a handler given none
    would answer as if a field were missing ("No such order: None")."""
    params: dict[str, Any] = dict(request.url.params)
    problem = None
    if request.content and request.headers.get("content-type", "").startswith(FORM_TYPE):
        # Stripe's SDKs send form bodies; values stay strings, as on the wire.
        try:
            form = request.content.decode()
        except UnicodeDecodeError:  # raw bytes where percent-escapes belong
            form = ""
            problem = "the form body is not UTF-8 (encode its values with percent-escapes)"
        params.update(urllib.parse.parse_qsl(form, keep_blank_values=True))
    elif request.content:
        try:
            body = json.loads(request.content)
        except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
            body = None
            problem = (
                "the request body is neither JSON nor form data (application/x-www-form-urlencoded)"
            )
        else:
            if _may_hold_surrogates(request.content) and _has_lone_surrogate(body):
                # Committed, its reply (and every later list holding it) could not be encoded.
                body = None
                problem = "the request body holds a \\u escape of half a surrogate pair"
        if isinstance(body, dict):
            params.update(body)
        elif problem is None:
            problem = (
                f"the request body must be a JSON object of parameters, not {type(body).__name__}"
            )
    params.update(path_params)
    return params, problem


_LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a surrogate code point: a cheap screen before the exact check."""


def _may_hold_surrogates(content: bytes) -> bool:
    """Whether a JSON body needs the exact check: it escapes a surrogate, or it is UTF-16 or
    UTF-32 (which json.loads reads too, and whose escapes the byte screen cannot see; their
    ASCII characters carry NUL bytes, which UTF-8 JSON never does)."""
    return b"\x00" in content or _LONE_SURROGATE.search(content) is not None


def _has_lone_surrogate(body: Any) -> bool:
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _side_effect_signature(request: httpx.Request, **path_params: str) -> None:
    """The signature of every route side effect below."""


# respx reads a side effect's signature on every call (to see whether it wants ``route``);
# computed from source each time, that was a tenth of an attempt. Side effects carry it
# ready-made instead (inspect.signature returns ``__signature__`` when it is set).
_SIDE_EFFECT_SIGNATURE = inspect.signature(_side_effect_signature)


def _key_rejection(kind: str, key: str) -> httpx.Response:
    """The response to a keyed request that must not run (Stripe v1 / IETF rules)."""
    if kind == "too_long":
        return error_response(
            400, f"Idempotency-Key is {len(key)} characters; at most {MAX_KEY_LENGTH} allowed"
        )
    if kind == "malformed":
        what = "empty" if not key else f"{key!r}, not printable ASCII"
        return error_response(400, f"Idempotency-Key is {what}; give a unique key per operation")
    if kind == "conflict":
        return error_response(
            422,
            "Keys for idempotent requests can only be used with the same parameters they were "
            f"first used with. Key {key!r} was used with different parameters.",
            type="idempotency_error",
        )
    # In flight: not saved, so a retry with the same key gets the first request's response.
    return error_response(
        409,
        f"A request with key {key!r} is already in progress; it has not finished yet. "
        "Do not repeat it: retry with the same key shortly.",
        type="idempotency_error",
    )


_HANDLER_FAILED = {
    "error": {"type": "api_error", "message": "The service failed while handling the request"}
}


_BOUND: contextvars.ContextVar[Services] = contextvars.ContextVar("twice_services")
"""The :class:`Services` a request being served belongs to (set by its transport)."""

Layout = tuple[tuple[str, str, tuple[tuple[str, str, str], ...]], ...]
"""(service name, base URL, ((method, path, route name), ...)) per service of a set."""


class _SharedRouter(respx.Router):
    """A router shared by every trial of one layout; it keeps no record of calls.

    respx records every request and response on the router and its route; shared by a whole
    run, those lists would hold every request of every trial. The ledger is the record.
    """

    def record(
        self,
        request: httpx.Request,
        *,
        response: httpx.Response | None = None,
        route: respx.Route | None = None,
    ) -> None:
        return None

    # respx re-raises a side effect's exception as ``raise origin from SideEffectError(origin)``:
    # the origin's cause (and context) is the wrapper, whose cause is the origin again. A
    # traceback printer without a seen-set (rich's, which inspect uses) walks that cycle for
    # ever, so one bug in a service handler hung the whole run. The wrapper says nothing the
    # origin does not, so the origin is raised on its own.

    def handler(self, request: httpx.Request) -> httpx.Response:
        try:
            return super().handler(request)
        except Exception as error:
            _untangle(error)
            raise

    async def async_handler(self, request: httpx.Request) -> httpx.Response:
        try:
            return await super().async_handler(request)
        except Exception as error:
            _untangle(error)
            raise


def _untangle(error: BaseException) -> None:
    """Cut respx's wrapper out of ``error``'s cause and context chain, putting back the
    chain the handler raised it with (saved by :func:`_side_effect`)."""
    cause, context, suppress = getattr(error, "_twice_chain", (None, None, False))
    for link, saved in (("__cause__", cause), ("__context__", context)):
        linked = getattr(error, link)
        if isinstance(linked, respx.models.SideEffectError) and linked.origin is error:
            setattr(error, link, saved)
    error.__suppress_context__ = suppress


def _keep_chain(error: BaseException) -> None:
    # respx's re-raise overwrites the handler's own cause and context: kept for _untangle.
    with contextlib.suppress(AttributeError):
        error._twice_chain = (  # type: ignore[attr-defined]
            error.__cause__,
            error.__context__,
            error.__suppress_context__,
        )


_ROUTERS: dict[tuple[Layout, bool], respx.Router] = {}
MAX_ROUTERS = 256
"""Routers kept for reuse (one per layout and blocking/async; a suite has a handful)."""


def _bound() -> Services:
    try:
        return _BOUND.get()
    except LookupError:
        raise RuntimeError(
            "a shared services router was called outside a Services transport; "
            "use Services.client() / sync_client() / dispatch()"
        ) from None


UNMATCHED_ROUTE = "unmatched"
"""The shared router's catch-all route (a request no service route matches)."""


def _shared_router(layout: Layout, *, sync: bool) -> respx.Router:
    """The router of ``layout``: built on first use, then reused by every trial."""
    router = _ROUTERS.get((layout, sync))
    if router is not None:
        return router
    router = _SharedRouter(assert_all_called=False, assert_all_mocked=False)
    for _service, base_url, routes in layout:
        for method, path, name in routes:
            pattern = re.escape(base_url) + path + r"/?(\?.*)?$"
            router.route(method=method, url__regex=pattern, name=name).mock(
                side_effect=_side_effect(name, sync=sync)
            )
    router.route(name=UNMATCHED_ROUTE).mock(
        side_effect=lambda request: _bound()._unmatched(request)
    )
    if len(_ROUTERS) >= MAX_ROUTERS:
        _ROUTERS.clear()
    _ROUTERS[(layout, sync)] = router
    return router


def _side_effect(name: str, *, sync: bool) -> Callable[..., Any]:
    """The side effect of route ``name``: the bound trial's pipeline for it."""
    if sync:

        def run_sync(request: httpx.Request, **path_params: str) -> httpx.Response:
            services = _bound()
            steps = services._pipeline(*services._routes[name], request, path_params)
            try:
                while True:
                    next(steps)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            except Exception as error:
                _keep_chain(error)
                raise

        run_sync.__signature__ = _SIDE_EFFECT_SIGNATURE  # type: ignore[attr-defined]
        return run_sync

    async def run_async(request: httpx.Request, **path_params: str) -> httpx.Response:
        services = _bound()
        steps = services._pipeline(*services._routes[name], request, path_params)
        try:
            while True:
                with services._lock:
                    next(steps)
                # The in-flight window: a concurrent request with the same key sees the
                # reservation here and gets 409, as it would against a real server.
                await asyncio.sleep(0)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        except Exception as error:
            _keep_chain(error)
            raise

    run_async.__signature__ = _SIDE_EFFECT_SIGNATURE  # type: ignore[attr-defined]
    return run_async


class _Cookies(httpx.Cookies):
    """A client's cookie jar that reads only the responses that set a cookie.

    httpx hands every response to the standard library's cookie jar, wrapping request and
    response in urllib objects first (the request's URL parsed again): about a sixth of a
    mock request's client-side CPU, for services that rarely set a cookie. A response that
    sets one is read exactly as httpx reads it.
    """

    def extract_cookies(self, response: httpx.Response) -> None:
        if "set-cookie" in response.headers:  # case-insensitive, as HTTP header names are
            super().extract_cookies(response)


class _ReadsCookiesOnDemand:
    """Mixed into httpx's clients: their cookies live in a :class:`_Cookies` jar, through the
    public ``cookies`` property (the one place httpx reads and sets a client's cookies)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cookies = super().cookies  # type: ignore[misc]  # the setter below

    @property
    def cookies(self) -> httpx.Cookies:
        return self._twice_cookies

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        self._twice_cookies = _Cookies(cookies)


class _AsyncClient(_ReadsCookiesOnDemand, httpx.AsyncClient):
    pass


class _Client(_ReadsCookiesOnDemand, httpx.Client):
    pass


class Services:
    """The mock services of one trial, their shared ledger and fault, and an httpx client.

    Args:
        services: Service instances, each used by this set only.
        fault: The fault to inject (default: none).

    Example:
        >>> services = Services([PaymentsService()], fault=LostReply())
        >>> async with services.client() as client:
        ...     await client.post("https://payments.twice.test/v1/refunds", json={...})
        >>> len(services.ledger.effects)
    """

    def __init__(self, services: Iterable[Service], fault: Fault | None = None) -> None:
        self.ledger = Ledger()
        self.fault: Fault = fault or NoFault()
        self.services: dict[str, Service] = {}
        for service in services:
            if service.name in self.services:
                raise ValueError(f"two services named {service.name!r} in one Services set")
            service._services = self
            self.services[service.name] = service
        # Route name → (service, route) of this trial: what the shared router dispatches to.
        self._routes: dict[str, tuple[Service, Route]] = {}
        layout = []
        for service in self.services.values():
            routes = service.routes()
            for r in routes:
                # A route name is an effect's identity, and the router keeps one route per
                # name: a second route of one name would silently replace the first (and the
                # router's own catch-all, added last, any route of its name).
                if r.name == UNMATCHED_ROUTE:
                    raise ValueError(
                        f"route name {UNMATCHED_ROUTE!r} ({r.method} {r.path}) is the router's "
                        "own catch-all; give the route another name"
                    )
                if r.name in self._routes:
                    other = self._routes[r.name][1]
                    raise ValueError(
                        f"two routes named {r.name!r} ({other.method} {other.path} and "
                        f"{r.method} {r.path}); each route needs a name of its own"
                    )
                self._routes[r.name] = (service, r)
            layout.append(
                (service.name, service.base_url, tuple((r.method, r.path, r.name) for r in routes))
            )
        self._layout: Layout = tuple(layout)
        self.ledger.known_effects = frozenset(self._routes)  # every route is an effect name
        # Re-entrant: the blocking path holds it for a whole request, and the unmatched route
        # (shared by both paths) takes it again.
        self._lock = threading.RLock()
        self.router = _shared_router(self._layout, sync=False)
        """The (shared) respx router serving this set's async requests."""
        self._sync_router: respx.Router | None = None
        # Mutating attempts so far, in total (key None) and per route: a fault's schedule
        # counts them on every attempt, and a trial's ledger only grows.
        self._mutating: collections.Counter[str | None] = collections.Counter()
        # Scheduled hits of a commit fault that met a request which did no work (refused for
        # its key, or a 4xx): each passes to the next matching mutating attempt.
        self._deferred = 0

    def __getitem__(self, name: str) -> Service:
        return self.services[name]

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        """An async httpx client whose transport serves this trial's services."""
        return _AsyncClient(transport=httpx.MockTransport(self._serve_async), **kwargs)

    def sync_client(self, **kwargs: Any) -> httpx.Client:
        """A blocking httpx client on the same services (no in-flight window)."""
        return _Client(transport=httpx.MockTransport(self.dispatch), **kwargs)

    @property
    def sync_router(self) -> respx.Router:
        """The (shared) router whose side effects are synchronous, for blocking clients."""
        if self._sync_router is None:
            self._sync_router = _shared_router(self._layout, sync=True)
        return self._sync_router

    def dispatch(self, request: httpx.Request) -> httpx.Response:
        """Serve one request synchronously (usable as a respx side effect anywhere).

        Thread-safe: requests from several threads are served one at a time.
        """
        with self._lock:
            token = _BOUND.set(self)
            try:
                return self.sync_router.handler(request)
            finally:
                _BOUND.reset(token)

    async def _serve_async(self, request: httpx.Request) -> httpx.Response:
        # A context variable is per asyncio task: concurrent trials (and concurrent requests,
        # each its own task under gather) each see their own binding.
        token = _BOUND.set(self)
        try:
            return await self.router.async_handler(request)
        finally:
            _BOUND.reset(token)

    def _unmatched(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            attempt = self._record(
                request, service="unknown", route=None, mutating=False, params={}
            )
            response = error_response(404, self._no_endpoint(request), type="not_found")
            self._finish(attempt, response)
            return response

    def _no_endpoint(self, request: httpx.Request) -> str:
        """The 404's message. On a service's host it names the service and the path alone:
        the host is one the client never saw when it came through ``twice serve`` (which
        forwards to the service's own base URL). On any other host, the whole URL."""
        url = str(request.url)
        for service in self.services.values():
            base = service.base_url
            if url == base or url.startswith(base + "/") or url.startswith(base + "?"):
                path = url[len(base) :] or "/"
                return f"the {service.label} has no endpoint {request.method} {path}"
        return f"no such endpoint: {request.method} {url}"

    # -- the pipeline ----------------------------------------------------------------------

    def _record(
        self,
        request: httpx.Request,
        *,
        service: str,
        route: str | None,
        mutating: bool,
        params: dict[str, Any],
    ) -> Attempt:
        call = request.headers.get(CALL_HEADER)
        attempt = Attempt(
            n=len(self.ledger.attempts) + 1,
            service=service,
            method=request.method,
            path=request.url.path,
            route=route,
            mutating=mutating,
            key=request.headers.get(KEY_HEADER),
            params=params,
            source=request.headers.get(SOURCE_HEADER, "unknown"),
            call=int(call) if call and call.isdigit() else None,
            backoff=float(request.headers.get(BACKOFF_HEADER, 0) or 0),
        )
        self.ledger.attempts.append(attempt)
        if mutating:
            self._mutating[None] += 1
            self._mutating[route] += 1
        return attempt

    @staticmethod
    def _finish(attempt: Attempt, response: httpx.Response | None, delivered: bool = True) -> None:
        attempt.status = None if response is None else response.status_code
        attempt.delivered = delivered
        attempt.outcome = outcome_of(attempt.status, delivered)

    def _fault_for(self, attempt: Attempt) -> Fault | None:
        schedule = self.fault.schedule
        if isinstance(self.fault, NoFault) or not attempt.mutating:
            return None
        # The attempt is already recorded, so the count includes it.
        nth = self._mutating[schedule.route]
        if schedule.hits(attempt, nth):
            return self.fault
        if self._deferred and schedule.matches(attempt):
            self._deferred -= 1  # the hit a request that did no work could not take
            return self.fault
        return None

    def _defer(self, attempt: Attempt, fault: Fault) -> None:
        """``fault`` was scheduled on ``attempt``, which did no work: a commit fault (a reply
        lost *after the work*) cannot hit it, so it hits the next mutating attempt instead.
        An agent whose first call is malformed is still tested against the fault."""
        attempt.fault = None
        if fault.commits and not fault.schedule.every:
            self._deferred += 1

    def _handle(
        self, service: Service, route: Route, call: Call, key: str | None
    ) -> httpx.Response:
        """Run the handler and settle the request's idempotency key."""
        try:
            response = route.handler(call)
        except Exception:
            if key is not None:
                if call.attempt.effect_ids:
                    # It committed before failing: save a 500, as a service that began
                    # executing does, so a keyed retry can never redo the half-done work.
                    service.keys.save(key, 500, _HANDLER_FAILED)
                else:
                    # Nothing was done: free the key, or every later request with it gets 409.
                    service.keys.release(key)
            # The client got an exception, not a reply: the outcome is unknown to it.
            self._finish(call.attempt, None, delivered=False)
            raise
        if key is not None:
            if 400 <= response.status_code < 500:
                # Validation failures never began executing: not saved, retryable.
                service.keys.release(key)
            else:
                service.keys.save(key, response.status_code, response.json())
        return response

    def _pipeline(
        self, service: Service, route: Route, request: httpx.Request, path_params: dict[str, str]
    ) -> Generator[None, None, httpx.Response]:
        params, problem = _params(request, path_params)
        attempt = self._record(
            request, service=service.name, route=route.name, mutating=route.mutating, params=params
        )
        fault = self._fault_for(attempt)
        if fault is not None:
            attempt.fault = fault.name

        # Keys only mean something on POST (Stripe: "sending them on GET and DELETE has no effect"),
        # and only to a service that supports them.
        honoured = route.mutating and request.method == "POST" and service.idempotency_keys
        key = attempt.key if honoured else None
        saved = None
        if key is not None:
            decision = service.keys.begin(key, fingerprint(request.method, route.path, params))
            if decision.kind != "new" and decision.kind != "replay":
                response = _key_rejection(decision.kind, key)
                if fault is not None:
                    self._defer(attempt, fault)
                self._finish(attempt, response)
                return response
            if decision.kind == "replay":
                saved = decision.saved

        if fault is not None:
            try:
                early = fault.before_commit(request)
            except Exception:
                if key is not None and saved is None:
                    service.keys.release(key)
                self._finish(attempt, None, delivered=False)
                raise
            if early is not None:
                if key is not None and saved is None:
                    service.keys.release(key)
                self._finish(attempt, early)
                return early

        if problem is not None and saved is None:  # refused before it began, as any 400
            if key is not None:
                service.keys.release(key)
            if fault is not None:
                self._defer(attempt, fault)
            response = error_response(400, problem)
            self._finish(attempt, response)
            return response

        yield  # in flight

        if saved is not None:
            attempt.replayed = True
            response = httpx.Response(
                saved.status or 500, json=saved.body, headers={REPLAYED_HEADER: "true"}
            )
        else:
            response = self._handle(service, route, Call(service, request, params, attempt), key)
            if fault is not None and fault.commits and 400 <= response.status_code < 500:
                # A validation failure never began executing: nothing to lose a reply after.
                self._defer(attempt, fault)
                fault = None

        if fault is not None:
            try:
                replaced = fault.after_commit(request, response)
            except Exception:
                self._finish(attempt, response, delivered=False)
                raise
            if replaced is not response and fault.saved and key is not None and saved is None:
                # The service itself answered with the error, so that is what gets saved
                # and replayed (Stripe saves 5xx responses too). A gateway's error is not
                # the service's answer: its saved response stays.
                service.keys.save(key, replaced.status_code, replaced.json())
            response = replaced

        self._finish(attempt, response)
        return response
