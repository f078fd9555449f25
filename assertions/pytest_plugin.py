"""twice's pytest plugin: run your own tool code against twice's mock services.

Load it explicitly; it is not auto-loaded into every pytest run::

    # conftest.py at the root of your tests
    pytest_plugins = ["twice.assertions.pytest_plugin"]

or ``pytest -p twice.assertions.pytest_plugin``.

Fixtures:

* ``twice_services`` -- the services a test runs against (default: ``[PaymentsService()]`` at
  ``https://payments.twice.test``). Override it to choose services, their state and the base
  URL your code calls.
* ``twice_fault`` -- the fault: from ``@pytest.mark.twice_mock(fault="lost_reply")`` (a fault
  name or a :class:`mocks.Fault`), or parametrize it: ``@pytest.mark.parametrize("twice_fault",
  ["none", "lost_reply"])``, not both (that is an error naming the two). Default ``"none"``.
* ``twice_mock`` -- starts the services for the test: every httpx request (sync or async
  client) to one of their base URLs is served by them. A :class:`TwiceMock`.
* ``ledger`` -- the test's :class:`mocks.Ledger`, for :func:`assertions.assert_side_effects`.

A request to a host no service mocks is refused by default, as respx and pytest-httpx refuse
one: the request raises :class:`UnmockedRequestError`, naming the host and the opt-out, and the
test fails at teardown (even if the code under test swallowed the error), since it may have
been meant for a real API. To let such requests through to the network, with an
:class:`UnmockedRequestWarning`, use ``@pytest.mark.twice_mock(unmocked="warn")`` for one test
or ``twice_unmocked = warn`` in the pytest ini options for every test; ``"allow"`` lets them
through silently.

At teardown, a fault that never fired fails the test (a fault that never fires proves
nothing); opt out with ``@pytest.mark.twice_mock(assert_fault_fired=False)``.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Generator, Iterator
from typing import Any, Literal, get_args

import httpx
import pytest
import respx
import respx.mocks
from respx.models import PassThrough
from twice.mocks import (
    Fault,
    Ledger,
    NoFault,
    PaymentsService,
    RunError,
    Service,
    Services,
    get_fault,
    start_own_transport,
    stop_own_transport,
    through_own_transport,
)

from ._checks import Assertion, assert_side_effects
from ._verdict import Verdict

MARKER = "twice_mock"
MARKER_OPTIONS: dict[str, str] = {
    "fault": "a fault name (twice list) or a mocks.Fault; default 'none'",
    "assert_fault_fired": "fail the test when the fault never fired (default True)",
    "unmocked": "a request to a host no service mocks: 'fail' (default), 'warn' or 'allow'",
}
UNMOCKED_INI = "twice_unmocked"
Unmocked = Literal["fail", "warn", "allow"]
"""What a request to a host no service mocks does: is refused and fails the test (the
default), goes through with a warning, or goes through silently."""
UNMOCKED_MODES: tuple[str, ...] = get_args(Unmocked)
ALLOW_HINT = (
    f"To let requests to unmocked hosts through to the network, mark the test "
    f"@pytest.mark.{MARKER}(unmocked='warn') (or 'allow', silently), or set "
    f"{UNMOCKED_INI} = warn in the pytest ini options."
)
"""The opt-out, as every refusal states it."""


class UnmockedRequestWarning(UserWarning):
    """A request matched no mocked service and went to the real network."""


class UnmockedRequestError(RunError):
    """Raised to the client for a request that matched no mocked service (unless
    ``unmocked`` lets it through)."""


_CALL_REPORT = pytest.StashKey[pytest.TestReport]()


class TwiceMock:
    """twice's mock services, intercepting httpx for the duration of a test.

    Requests whose URL starts with a service's base URL are served by the services (through
    :meth:`mocks.Services.dispatch`), for ``httpx.Client`` and ``httpx.AsyncClient`` alike;
    every other request is refused, unless ``unmocked`` lets it through. Usable outside pytest
    as a context manager.

    Requests are served one at a time (the blocking path of the services), so two concurrent
    requests with one idempotency key get a replay rather than the in-flight 409.

    Args:
        services: The trial's services, ledger and fault.
        unmocked: What a request to any other host does: ``"fail"`` (the default: raises
            :class:`UnmockedRequestError`), ``"warn"`` (goes through, with an
            :class:`UnmockedRequestWarning`) or ``"allow"`` (goes through silently).

    Raises:
        ValueError: for an unknown ``unmocked`` mode, naming the accepted ones.
    """

    def __init__(self, services: Services, unmocked: Unmocked = "fail") -> None:
        if unmocked not in UNMOCKED_MODES:
            raise ValueError(
                f"unmocked must be one of {', '.join(UNMOCKED_MODES)}, got {unmocked!r}"
            )
        self.services = services
        self.unmocked = unmocked
        self._unmocked_urls: list[str] = []
        self._own_started = False
        # A MockRouter of our own (never respx's global one), patching httpx clients only.
        self.router = respx.MockRouter(
            using="httpx", assert_all_called=False, assert_all_mocked=True
        )
        for service in services.services.values():
            # The base URL is normalised like a request's (lowercase host, no default port).
            pattern = "^" + re.escape(service.base_url) + r"(?:[/?#]|$)"
            self.router.route(url__regex=pattern, name=f"twice:{service.name}").mock(
                side_effect=self._serve
            )
        self.router.route(name="twice:unmocked").mock(side_effect=self._other_host)

    def _serve(self, request: httpx.Request) -> Any:
        """A mocked service's answer; through the client's own transport when it wraps
        httpx's (a retrying transport), so each attempt it makes is served and counted."""
        return through_own_transport(request, self.services.dispatch)

    def _other_host(self, request: httpx.Request) -> httpx.Request | httpx.Response:
        """A request no service mocks: left to the test's own respx routes, refused, or let
        through (returning the request is respx's pass-through)."""
        answer = self._answered_by_the_tests_respx(request)
        if answer is not None:
            return answer
        url = str(request.url)
        self._unmocked_urls.append(url)
        where = f"{request.method} {url} matched no mocked service ({', '.join(self.base_urls)})"
        if self.unmocked == "fail":
            raise UnmockedRequestError(
                f"twice: {where}; refused: host {request.url.host} is not mocked. Point the "
                "code under test at a mocked base URL, or mock that host too (override the "
                f"twice_services fixture). {ALLOW_HINT}"
            )
        if self.unmocked == "warn":
            warnings.warn(
                f"twice: {where} and went to the real network (unmocked='warn'). Refuse "
                "it, as by default, with unmocked='fail'; silence it with unmocked='allow'.",
                UnmockedRequestWarning,
                stacklevel=2,
            )
        return request

    def _answered_by_the_tests_respx(
        self, request: httpx.Request
    ) -> httpx.Request | httpx.Response | None:
        """What to do with a request a respx mock of the test's own has a route for: None when
        none has. Such a request never reaches the network, so it is neither warned about nor
        refused. A router patching httpx's transports below ours (respx's default, httpcore)
        answers it once we pass it on; one at our level (``using="httpx"``) is never asked
        after our catch-all route, so it is asked here."""
        for mocker in respx.mocks.Mocker.registry.values():
            for router in mocker.routers:
                if router is self.router or not _has_route_for(router, request):
                    continue
                if self.router not in mocker.routers:
                    return request  # pass it on: the test's router answers it below
                try:
                    return router.handler(request)
                except PassThrough:  # the test's route lets it through itself
                    return request
        return None

    @property
    def ledger(self) -> Ledger:
        """Every attempt and effect of this test."""
        return self.services.ledger

    @property
    def fault(self) -> Fault:
        """The fault in force."""
        return self.services.fault

    @property
    def base_urls(self) -> list[str]:
        """The intercepted base URLs."""
        return [s.base_url for s in self.services.services.values()]

    def observe(self, text: str) -> str:
        """Record a text the agent would be shown (a tool's result), for
        :func:`assertions.no_unseen_effects`; returns it unchanged."""
        self.ledger.observations.append(text)
        return text

    def assert_side_effects(self, *assertions: Assertion) -> list[Verdict]:
        """:func:`assertions.assert_side_effects` on this test's ledger."""
        __tracebackhide__ = True
        return assert_side_effects(self.ledger, *assertions)

    def passed_through(self) -> list[str]:
        """URLs of the requests that matched no service (refused, or let through when
        ``unmocked`` allows it)."""
        return list(self._unmocked_urls)

    def unmocked_message(self) -> str | None:
        """Why the test fails for requests to unmocked hosts it refused; else None."""
        urls = self.passed_through()
        if self.unmocked != "fail" or not urls:
            return None
        shown = ", ".join(urls[:3]) + (", ..." if len(urls) > 3 else "")
        return (
            f"twice: {len(urls)} request(s) matched no mocked service and were refused: "
            f"{shown}. Point the code under test at a mocked base URL "
            f"({', '.join(self.base_urls)}), or mock that host too. {ALLOW_HINT}"
        )

    def fault_fired(self) -> bool:
        """Whether the fault hit some attempt (always True when there is no fault)."""
        return _no_fault(self.fault) or bool(self.ledger.faults_fired())

    def unfired_fault_message(self) -> str | None:
        """Why the fault never fired and what to do, or None when it fired."""
        if self.fault_fired():
            return None
        attempts = self.ledger.attempts
        mutating = [a for a in attempts if a.mutating]
        if not attempts:
            what = f"no request reached the mock services at {', '.join(self.base_urls)}"
            if not self.passed_through():
                # Nothing went anywhere through httpx: the code may use another client.
                what += (
                    " and no httpx request was made at all (only httpx is intercepted: a "
                    "client such as requests, urllib or aiohttp goes to the network unseen)"
                )
        elif not mutating:
            what = (
                f"{len(attempts)} request(s) reached the mock services, none of them mutating "
                "(faults hit mutating requests only)"
            )
        else:
            what = (
                f"{len(mutating)} mutating request(s) reached the mock services, none of them "
                f"selected by the fault's {self.fault.schedule}"
            )
        passed = self.passed_through()
        if passed:
            shown = ", ".join(passed[:3]) + (", ..." if len(passed) > 3 else "")
            what += f"; {len(passed)} request(s) went to other URLs ({shown})"
        return (
            f"twice: the fault {self.fault.name!r} never fired: {what}. A fault that never "
            "fires proves nothing. Point the code under test at the mocked base URL (choose it "
            "by overriding the twice_services fixture), or opt out with "
            "@pytest.mark.twice_mock(assert_fault_fired=False)."
        )

    def start(self) -> None:
        """Start intercepting httpx."""
        if not self._own_started:
            start_own_transport()
            self._own_started = True
        self.router.start()

    def stop(self) -> None:
        """Stop intercepting httpx (the recorded calls are kept for the teardown check)."""
        self.router.stop(clear=False, reset=False, quiet=True)
        if self._own_started:
            stop_own_transport()
            self._own_started = False

    def __enter__(self) -> TwiceMock:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _no_fault(fault: Fault) -> bool:
    return isinstance(fault, NoFault) or type(fault) is Fault


def _has_route_for(router: respx.Router, request: httpx.Request) -> bool:
    """Whether one of ``router``'s routes matches ``request`` (patterns only: no side effect
    runs and nothing is recorded). A route marked pass-through does not count: it sends the
    request to the network, which is what the warning is for."""
    for route in router.routes:
        if getattr(route, "_pass_through", False):
            continue
        if not route.pattern or route.pattern.match(request):
            return True
    return False


def _marker_options(node: pytest.Item) -> dict[str, Any]:
    """Options of every ``twice_mock`` marker on the test, the closest winning."""
    options: dict[str, Any] = {}
    for marker in node.iter_markers(MARKER):
        if marker.args:
            pytest.fail(
                f"@pytest.mark.{MARKER} takes keyword arguments only, got {marker.args!r}; "
                f"accepted: {', '.join(MARKER_OPTIONS)}",
                pytrace=False,
            )
        unknown = set(marker.kwargs) - set(MARKER_OPTIONS)
        if unknown:
            pytest.fail(
                f"@pytest.mark.{MARKER} got unknown option(s) {', '.join(sorted(unknown))}; "
                f"accepted: {', '.join(MARKER_OPTIONS)}",
                pytrace=False,
            )
        for key, value in marker.kwargs.items():
            options.setdefault(key, value)
    return options


def _as_fault(value: object) -> Fault:
    if isinstance(value, Fault):
        return value
    if isinstance(value, str):
        try:
            return get_fault(value)
        except ValueError as ex:
            pytest.fail(f"twice: {ex}", pytrace=False)
    pytest.fail(
        f"twice: a fault must be a fault name or a mocks.Fault, got {value!r}", pytrace=False
    )


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``twice_unmocked`` ini option (for every test)."""
    parser.addini(
        UNMOCKED_INI,
        "twice: what a request to a host no mocked service serves does: fail (default), "
        "warn or allow",
        default="fail",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``twice_mock`` marker."""
    options = "; ".join(f"{k}: {v}" for k, v in MARKER_OPTIONS.items())
    config.addinivalue_line(
        "markers",
        f"{MARKER}(fault=..., assert_fault_fired=True, unmocked='fail'): twice's mock services "
        f"({options})",
    )


def _unmocked_mode(request: pytest.FixtureRequest, options: dict[str, Any]) -> Unmocked:
    if "unmocked" in options:
        value, where = options["unmocked"], f"@pytest.mark.{MARKER}(unmocked=...)"
    else:
        value, where = request.config.getini(UNMOCKED_INI), f"the {UNMOCKED_INI} ini option"
    if value not in UNMOCKED_MODES:
        pytest.fail(
            f"twice: {where} must be one of {', '.join(UNMOCKED_MODES)}, got {value!r}",
            pytrace=False,
        )
    mode: Unmocked = value
    return mode


def _check_one_fault(request: pytest.FixtureRequest, options: dict[str, Any]) -> None:
    """A fault from ``parametrize("twice_fault")`` and one from the marker conflict."""
    callspec = getattr(request.node, "callspec", None)
    params = callspec.params if callspec is not None else {}
    if "twice_fault" in params and "fault" in options:
        pytest.fail(
            f"twice: the test sets its fault twice: parametrize('twice_fault') gives "
            f"{params['twice_fault']!r} and @pytest.mark.{MARKER}(fault=...) gives "
            f"{options['fault']!r}; keep one of them",
            pytrace=False,
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``twice_mock`` marker on a test that does not use the fixture mocks nothing: its
    requests would reach the real hosts, and no fault would fire, with the test passing."""
    marker = item.get_closest_marker(MARKER)
    if marker is None or "twice_mock" in getattr(item, "fixturenames", ("twice_mock",)):
        return
    pytest.fail(
        f"twice: @pytest.mark.{MARKER} on {item.name} does nothing without the twice_mock "
        "fixture, so its requests would go to the real hosts: take `twice_mock` or `ledger` as "
        "an argument, or add @pytest.mark.usefixtures('twice_mock')",
        pytrace=False,
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep the test's call-phase report, so teardown checks skip tests that already failed."""
    report = yield
    if report.when == "call":
        item.stash[_CALL_REPORT] = report
    return report


@pytest.fixture
def twice_services() -> list[Service]:
    """The mock services of a test; override to choose services, their state and base URLs.

    Example:
        >>> @pytest.fixture
        ... def twice_services():
        ...     return [PaymentsService(orders=[...], base_url="https://api.example.com")]
    """
    return [PaymentsService()]


@pytest.fixture
def twice_fault(request: pytest.FixtureRequest) -> Fault | str:
    """The fault of a test: ``@pytest.mark.twice_mock(fault=...)``, else ``"none"``.

    Parametrize it directly to run a test under several faults.
    """
    param = getattr(request, "param", None)
    if param is not None:
        return param  # type: ignore[no-any-return]
    fault: Fault | str = _marker_options(request.node).get("fault", "none")
    return fault


@pytest.fixture
def twice_mock(
    request: pytest.FixtureRequest,
    twice_services: list[Service] | Service,
    twice_fault: Fault | str,
) -> Iterator[TwiceMock]:
    """twice's mock services, intercepting httpx for this test; fails at teardown when a
    configured fault never fired (opt out: ``@pytest.mark.twice_mock(assert_fault_fired=False)``).
    """
    options = _marker_options(request.node)
    _check_one_fault(request, options)
    unmocked = _unmocked_mode(request, options)
    services = [twice_services] if isinstance(twice_services, Service) else twice_services
    if not services or not all(isinstance(s, Service) for s in services):
        pytest.fail(
            f"twice: the twice_services fixture must return mocks.Service instances (a list, or "
            f"one), e.g. [PaymentsService(base_url=...)]; got {twice_services!r}",
            pytrace=False,
        )
    mock = TwiceMock(Services(services, fault=_as_fault(twice_fault)), unmocked=unmocked)
    with mock:
        yield mock
    report = request.node.stash.get(_CALL_REPORT, None)
    if report is not None and not report.passed:
        return  # the test already failed (or was skipped): do not pile on
    refused = mock.unmocked_message()
    if refused is not None:
        # Code under test may have swallowed the refusal: the test still fails.
        pytest.fail(refused, pytrace=False)
    if not options.get("assert_fault_fired", True):
        return
    message = mock.unfired_fault_message()
    if message is not None:
        pytest.fail(message, pytrace=False)


@pytest.fixture
def ledger(twice_mock: TwiceMock) -> Ledger:
    """The test's ledger: every attempt and effect the mock services saw."""
    return twice_mock.ledger
