"""Services as respx routes, bound per trial.

A :class:`Service` (``_service``) declares routes (method, path, ``service.resource.verb``
name, handler). A :class:`Services` set binds several services to one trial: one ledger, one
fault, and an httpx transport. Nothing is patched globally, so trials running concurrently
never see each other's state.

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
import contextvars
import inspect
import re
import threading
import time
from collections.abc import Callable, Generator, Iterable
from typing import Any

import httpx
import respx

from ._clients import AsyncClient, Client
from ._fault_hits import FaultHits
from ._faults import Fault
from ._idempotency import fingerprint
from ._ledger import Attempt, Ledger, outcome_of
from ._service import Call, Route, Service
from ._wire import (
    BACKOFF_HEADER,
    CALL_HEADER,
    HANDLER_FAILED,
    KEY_HEADER,
    REPLAYED_HEADER,
    SOURCE_HEADER,
    error_response,
    key_rejection,
    request_params,
)


def _side_effect_signature(request: httpx.Request, **path_params: str) -> None:
    """The signature of every route side effect below."""


# respx reads a side effect's signature on every call (to see whether it wants ``route``);
# computed from source each time, that was a tenth of an attempt. Side effects carry it
# ready-made instead (inspect.signature returns ``__signature__`` when it is set).
_SIDE_EFFECT_SIGNATURE = inspect.signature(_side_effect_signature)


_BOUND: contextvars.ContextVar[Services] = contextvars.ContextVar("twice_services")
"""The :class:`Services` a request being served belongs to (set by its transport)."""

Layout = tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...]
"""(base URL, ((method, path, route name), ...)) per service of a set: all a router is made
of (it dispatches by route name to the bound set, so two sets that differ only in their
services' names share one)."""


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
    chain the handler raised it with (saved by :func:`_keep_chain`)."""
    # Every side effect's error carries its chain, and respx re-raised each from its
    # wrapper (both links); an error without one is respx's own, which it never wrapped.
    chain = vars(error).get("_twice_chain")
    if chain is not None:
        error.__cause__, error.__context__, error.__suppress_context__ = chain


def _keep_chain(error: BaseException) -> None:
    """Keep the chain a side effect's error was raised with: respx's re-raise overwrites it.
    Every side effect keeps it, so :func:`_untangle` can cut every wrapper out."""
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
    # respx's assert_all_called / assert_all_mocked are never read: the router is never
    # started (stop() reads the first), and its catch-all matches every request.
    router = _SharedRouter()
    for base_url, routes in layout:
        for method, path, name in routes:
            pattern = re.escape(base_url) + path + r"/?(\?.*)?$"
            router.route(method=method, url__regex=pattern, name=name).mock(
                side_effect=_side_effect(name, sync=sync)
            )
    router.route(name=UNMATCHED_ROUTE).mock(side_effect=_catch_all)
    if len(_ROUTERS) >= MAX_ROUTERS:
        _ROUTERS.clear()
    _ROUTERS[(layout, sync)] = router
    return router


def _side_effect(name: str, *, sync: bool) -> Callable[..., Any]:
    """The side effect of route ``name``: the bound trial's pipeline for it."""
    if sync:

        def run_sync(request: httpx.Request, **path_params: str) -> httpx.Response:
            try:
                services = _bound()
                steps = services._pipeline(*services._routes[name], request, path_params)
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
        try:
            services = _bound()
            steps = services._pipeline(*services._routes[name], request, path_params)
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


def _catch_all(request: httpx.Request) -> httpx.Response:
    """The side effect of the catch-all route: the bound trial's 404."""
    try:
        return _bound()._unmatched(request)
    except Exception as error:
        _keep_chain(error)
        raise


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
        self.hits = FaultHits(fault)
        """Which mutating attempts of the trial the fault hits: one count for the whole trial,
        which ``twice serve``'s proxy to a real upstream shares."""
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
            layout.append((service.base_url, tuple((r.method, r.path, r.name) for r in routes)))
        self._layout: Layout = tuple(layout)
        self.ledger.known_effects = frozenset(self._routes)  # every route is an effect name
        # Re-entrant: the blocking path holds it for a whole request, and the unmatched route
        # (shared by both paths) takes it again.
        self._lock = threading.RLock()
        self.router = _shared_router(self._layout, sync=False)
        """The (shared) respx router serving this set's async requests."""
        self._sync_router: respx.Router | None = None

    @property
    def fault(self) -> Fault:
        """The fault injected (``hits.fault``)."""
        return self.hits.fault

    def __getitem__(self, name: str) -> Service:
        return self.services[name]

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        """An async httpx client whose transport serves this trial's services."""
        return AsyncClient(transport=httpx.MockTransport(self._serve_async), **kwargs)

    def sync_client(self, **kwargs: Any) -> httpx.Client:
        """A blocking httpx client on the same services (no in-flight window)."""
        return Client(transport=httpx.MockTransport(self.dispatch), **kwargs)

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
        key_header: str = KEY_HEADER,
    ) -> Attempt:
        call = request.headers.get(CALL_HEADER)
        attempt = Attempt(
            n=len(self.ledger.attempts) + 1,
            service=service,
            method=request.method,
            path=request.url.path,
            route=route,
            mutating=mutating,
            key=request.headers.get(key_header),
            params=params,
            source=request.headers.get(SOURCE_HEADER, "unknown"),
            call=int(call) if call and call.isdigit() else None,
            backoff=float(request.headers.get(BACKOFF_HEADER) or 0),
            at=time.time(),
        )
        self.ledger.attempts.append(attempt)
        return attempt

    @staticmethod
    def _finish(attempt: Attempt, response: httpx.Response | None, delivered: bool = True) -> None:
        attempt.status = None if response is None else response.status_code
        attempt.delivered = delivered
        attempt.outcome = outcome_of(attempt.status, delivered)

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
                    service.keys.save(key, 500, HANDLER_FAILED)
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
                # A reply with no body (a DELETE's 204) is saved as none, and replayed so.
                body = response.json() if response.content else None
                service.keys.save(key, response.status_code, body)
        return response

    def _pipeline(
        self, service: Service, route: Route, request: httpx.Request, path_params: dict[str, str]
    ) -> Generator[None, None, httpx.Response]:
        params, problem = request_params(request, path_params)
        attempt = self._record(
            request,
            service=service.name,
            route=route.name,
            mutating=route.mutating,
            params=params,
            key_header=service.key_header,
        )
        fault = self.hits.hit(attempt)

        # Keys only mean something on a mutating route's keyed methods (Stripe's POST: "sending
        # them on GET and DELETE has no effect"), and only to a service that supports them.
        honoured = (
            route.mutating and request.method in service.keyed_methods and service.idempotency_keys
        )
        key = attempt.key if honoured else None
        saved = None
        if key is not None:
            decision = service.keys.begin(key, fingerprint(request.method, route.path, params))
            if decision.kind != "new" and decision.kind != "replay":
                response = key_rejection(decision.kind, key, service.error_response)
                if fault is not None:
                    self.hits.defer(attempt, fault, before_hooks=True)
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
                self.hits.defer(attempt, fault)
            response = service.error_response(400, problem)
            self._finish(attempt, response)
            return response

        yield  # in flight

        if saved is not None:
            attempt.replayed = True
            assert saved.status is not None  # a replay's row is done: save() set its status
            response = httpx.Response(
                saved.status, json=saved.body, headers={REPLAYED_HEADER: "true"}
            )
        else:
            response = self._handle(service, route, Call(service, request, params, attempt), key)
            if fault is not None and fault.commits and 400 <= response.status_code < 500:
                # A validation failure never began executing: nothing to lose a reply after.
                self.hits.defer(attempt, fault)
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
