"""How a mock service is declared: its routes, the call a route's handler gets, the
:class:`Service` base class, and a trial's services built from a sample's state."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import httpx

from ._idempotency import IdempotencyStore
from ._ledger import Attempt, Effect, Ledger
from ._wire import KEY_HEADER, error_response


class _Owner(Protocol):
    """What a service needs of the set it belongs to (:class:`Services`)."""

    ledger: Ledger


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
    keyed_methods: ClassVar[frozenset[str]] = frozenset({"POST"})
    """The methods whose mutating routes honour the key (Stripe: a key on DELETE does nothing)."""
    key_header: ClassVar[str] = KEY_HEADER
    """The request header carrying the idempotency key (an API may declare another name)."""
    read_headers: ClassVar[frozenset[str]] = frozenset()
    """Lowercase names of request headers the service reads beyond twice's own (a server
    that logs requests to replay them keeps these); never credentials."""

    def __init__(self, base_url: str | None = None) -> None:
        self.base_url = _normal_base_url(base_url or self.default_base_url)
        self.keys = IdempotencyStore()
        self._counters: dict[str, int] = {}
        self._services: _Owner | None = None

    def routes(self) -> list[Route]:
        """The service's endpoints."""
        raise NotImplementedError

    def error_response(
        self, status: int, message: str, type: str = "invalid_request_error"
    ) -> httpx.Response:
        """An error in the service's own shape; the refusals the base class makes (a body
        that is not parameters, the idempotency-key rules) use it. Default: the Stripe shape
        ``{"error": {"type", "message"}}``."""
        return error_response(status, message, type)

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
