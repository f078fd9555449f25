"""The pytest plugin, through pytest itself (pytester): fixtures, faults and their messages."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

# An inline run shares this process: when an earlier test in it imported the plugin, pytest
# warns that it cannot rewrite its asserts. That is this suite's doing, not the user's run's,
# so it is not counted among the warnings a test asserts on.
NO_REWRITE_WARNING = ("-W", "ignore::pytest.PytestAssertRewriteWarning")
PLUGIN = ("-p", "twice.assertions.pytest_plugin", "--strict-markers", *NO_REWRITE_WARNING)


def run_with_default_warnings(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    """Run pytest inline with Python's default warning filters, as a user's run has them (an
    inline run inherits this suite's "warnings are errors" filter)."""
    with warnings.catch_warnings():
        warnings.resetwarnings()
        # last: a later -W wins, and a test's own "-W error::UserWarning" would catch it
        return project.runpytest(*PLUGIN, *args, *NO_REWRITE_WARNING)


EXAMPLES = Path(__file__).parents[2] / "docs" / "examples"

CONFTEST = """
import pytest
from twice.mocks import PaymentsService

@pytest.fixture
def twice_services():
    order = {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997}
    return [PaymentsService(orders=[order], base_url="https://payments.example.com")]

@pytest.fixture
def anyio_backend():
    return "asyncio"
"""

NAIVE = """
import httpx
import pytest
from twice.assertions import assert_side_effects, exactly

URL = "https://payments.example.com/v1/refunds"

def refund(client):
    for _ in range(3):
        try:
            return client.post(URL, json={"order_id": "order_1042", "amount": 499}).json()["id"]
        except httpx.TimeoutException:
            continue  # retried without an idempotency key

@pytest.mark.twice_mock(fault="lost_reply")
def test_sync_client_refunds_twice(ledger):
    with httpx.Client() as client:
        refund(client)
    assert_side_effects(ledger, exactly(1, "payments.refund.create", order_id="order_1042"))
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    return pytester


EVERY_BUILT_IN = """
import httpx
import pytest
from twice.mocks import PaymentsService, Route, Service
from twice.assertions import (
    assert_side_effects, at_least, at_most, compensated, exactly, never, no_unseen_effects,
)

class Trips(Service):
    \"\"\"A user's own fake service: book a flight, cancel it.\"\"\"

    name = "travel"

    def routes(self):
        return [
            Route("POST", r"/flights", "travel.flight.book", self.book, mutating=True),
            Route("POST", r"/flights/(?P<booking_id>fl_[0-9]+)/cancel", "travel.flight.cancel",
                  self.cancel, mutating=True),
        ]

    def book(self, call):
        fields = {"trip_id": call.params["trip_id"]}
        return httpx.Response(200, json={"id": call.commit("travel.flight.book", "fl", fields).id})

    def cancel(self, call):
        fields = {"booking_id": call.params["booking_id"]}
        effect = call.commit("travel.flight.cancel", "cx", fields)
        return httpx.Response(200, json={"id": effect.id})

@pytest.fixture
def twice_services():
    order = {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997}
    return [PaymentsService(orders=[order], base_url="https://pay.test"),
            Trips(base_url="https://trips.test")]

def refund_twice():
    for _ in range(2):
        httpx.post("https://pay.test/v1/refunds", json={"order_id": "order_1042", "amount": 5})

def test_exactly(ledger):
    refund_twice()
    assert_side_effects(ledger, exactly(1, "payments.refund.create", order_id="order_1042"))

def test_at_most(ledger):
    refund_twice()
    assert_side_effects(ledger, at_most(1, "payments.refund.create"))

def test_at_least(ledger):
    httpx.post("https://pay.test/v1/refunds", json={"order_id": "order_9", "amount": 5})
    assert_side_effects(ledger, at_least(1, "payments.refund.create"))

def test_never(ledger):
    refund_twice()
    assert_side_effects(ledger, never("payments.refund.create", order_id="order_1042"))

def test_compensated(ledger):
    booking = httpx.post("https://trips.test/flights", json={"trip_id": "t1"}).json()["id"]
    for _ in range(2):
        httpx.post(f"https://trips.test/flights/{booking}/cancel")
    assert_side_effects(
        ledger, compensated("travel.flight.book", by="travel.flight.cancel", on="booking_id")
    )

def test_no_unseen_effects(twice_mock):
    refund_twice()
    twice_mock.observe("Refunded: re_2")
    twice_mock.assert_side_effects(no_unseen_effects())
"""


def test_plugin_every_built_in_failure_message(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(EVERY_BUILT_IN)
    result = pytester.runpytest(*PLUGIN)
    result.assert_outcomes(failed=6)
    result.stdout.fnmatch_lines(
        [
            "E*payments.refund.create where order_id='order_1042': expected exactly 1, observed 2 "
            "(re_1 at attempt 1; re_2 at attempt 2)",
            "E*payments.refund.create: expected at most 1, observed 2 "
            "(re_1 at attempt 1; re_2 at attempt 2)",
            "E*payments.refund.create: expected at least 1, observed 0",
            "E*    attempt 1 POST /v1/refunds (no key): nothing committed, HTTP 404",
            "E*payments.refund.create where order_id='order_1042': expected none, observed 2 "
            "(re_1 at attempt 1; re_2 at attempt 2)",
            "E*travel.flight.book compensated by travel.flight.cancel on booking_id: expected "
            "exactly 1 travel.flight.cancel per travel.flight.book, observed fl_1 compensated "
            "2 times (fl_1 at attempt 1; cx_1 at attempt 2; cx_2 at attempt 3)",
            "E*effects the agent never saw: expected none, observed 1 (re_1 at attempt 1)",
        ],
        consecutive=False,
    )


def test_plugin_is_not_auto_loaded(project: pytest.Pytester) -> None:
    project.makepyfile("def test_uses_ledger(ledger):\n    pass\n")
    result = project.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'ledger' not found*"])


def test_plugin_reports_a_duplicate_refund_with_ledger_lines(project: pytest.Pytester) -> None:
    project.makepyfile(NAIVE)
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E*AssertionError: 1 of 1 side-effect assertion failed:",
            "E*payments.refund.create where order_id='order_1042': expected exactly 1, "
            "observed 2 (re_1 at attempt 1, reply lost; re_2 at attempt 2)",
            "E*    attempt 1 POST /v1/refunds (no key, fault lost_reply): "
            "committed re_1, reply lost",
            "E*    attempt 2 POST /v1/refunds (no key): committed re_2, HTTP 200",
        ]
    )
    # The fault fired, and the test failed anyway: no teardown error on top.
    assert "never fired" not in result.stdout.str()


def test_plugin_intercepts_async_clients(project: pytest.Pytester) -> None:
    project.makepyfile(
        """
        import httpx
        import pytest
        from twice.assertions import exactly

        @pytest.mark.anyio
        @pytest.mark.twice_mock(fault="lost_reply")
        async def test_async_client_refunds_twice(twice_mock):
            async with httpx.AsyncClient(base_url="https://payments.example.com") as client:
                with pytest.raises(httpx.ReadTimeout):
                    await client.post("/v1/refunds", json={"order_id": "order_1042", "amount": 499})
                second = await client.post(
                    "/v1/refunds", json={"order_id": "order_1042", "amount": 499}
                )
            assert second.json()["id"] == "re_2"
            twice_mock.assert_side_effects(exactly(2, "payments.refund.create"))
        """
    )
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1)


def test_plugin_fails_a_test_whose_fault_never_fired(project: pytest.Pytester) -> None:
    project.makepyfile(
        """
        import pytest

        @pytest.mark.twice_mock(fault="lost_reply")
        def test_does_nothing(ledger):
            pass
        """
    )
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_does_nothing*",
            "twice: the fault 'lost_reply' never fired: no request reached the mock services at "
            "https://payments.example.com and no httpx request was made at all (only httpx is "
            "intercepted: a client such as requests, urllib or aiohttp goes to the network "
            "unseen). A fault that never fires proves nothing. Point the code "
            "under test at the mocked base URL (choose it by overriding the twice_services "
            "fixture), or opt out with @pytest.mark.twice_mock(assert_fault_fired=False).",
        ]
    )


def test_plugin_unfired_fault_names_where_requests_went(project: pytest.Pytester) -> None:
    project.makepyfile(
        """
        import httpx
        import pytest

        def elsewhere(request):
            return httpx.Response(200, json={"id": "re_x"})

        @pytest.mark.twice_mock(fault="lost_reply", unmocked="allow")
        def test_calls_the_wrong_host(ledger):
            # The client's own transport stands in for the network: passed-through requests
            # reach it, so nothing leaves the machine.
            with httpx.Client(transport=httpx.MockTransport(elsewhere)) as client:
                client.get("https://payments.example.com/v1/orders/order_1042")
                client.post("https://pay.example.org/v1/refunds", json={})
        """
    )
    result = run_with_default_warnings(project)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "twice: the fault 'lost_reply' never fired: 1 request(s) reached the mock services, "
            "none of them mutating (faults hit mutating requests only); 1 request(s) went to "
            "other URLs (https://pay.example.org/v1/refunds).*",
        ]
    )


def test_plugin_unfired_fault_opt_out(project: pytest.Pytester) -> None:
    project.makepyfile(
        """
        import pytest

        @pytest.mark.twice_mock(fault="lost_reply", assert_fault_fired=False)
        def test_does_nothing(ledger):
            pass
        """
    )
    project.runpytest(*PLUGIN).assert_outcomes(passed=1)


def test_plugin_skips_the_fault_check_when_the_test_failed(project: pytest.Pytester) -> None:
    project.makepyfile(
        """
        import pytest

        @pytest.mark.twice_mock(fault="lost_reply")
        def test_fails_first(ledger):
            assert False, "broken before any request"
        """
    )
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(failed=1)
    assert "never fired" not in result.stdout.str()


def test_plugin_faults_by_parametrize_and_by_fault_object(project: pytest.Pytester) -> None:
    project.makepyfile(
        """
        import httpx
        import pytest
        from twice.mocks import LostReply, Schedule

        URL = "https://payments.example.com/v1/refunds"
        BODY = {"order_id": "order_1042", "amount": 499}

        @pytest.mark.parametrize("twice_fault", ["none", "error_before_commit"])
        def test_each_fault(twice_fault, twice_mock):
            status = httpx.post(URL, json=BODY).status_code
            assert twice_mock.fault.name == twice_fault
            assert status == (200 if twice_fault == "none" else 503)

        @pytest.mark.twice_mock(fault=LostReply(schedule=Schedule(attempts=(2,))))
        def test_second_attempt_loses_its_reply(ledger):
            assert httpx.post(URL, json=BODY).status_code == 200
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(URL, json=BODY)
            assert [a.fault for a in ledger.attempts] == [None, "lost_reply"]
        """
    )
    project.runpytest(*PLUGIN).assert_outcomes(passed=3)


def test_plugin_bad_marker_option_and_fault_name_error(project: pytest.Pytester) -> None:
    project.makepyfile(
        """
        import pytest

        @pytest.mark.twice_mock(faults="lost_reply")
        def test_typo(ledger):
            pass

        @pytest.mark.twice_mock(fault="lost-reply")
        def test_bad_fault(ledger):
            pass
        """
    )
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.twice_mock got unknown option(s) faults; accepted: fault, "
            "assert_fault_fired, unmocked*",
            "*twice: unknown fault 'lost-reply'; expected one of: none, lost_reply,*",
        ]
    )


def test_plugin_marker_without_the_fixture_is_an_error(project: pytest.Pytester) -> None:
    # The failing path: the marker alone mocked nothing, the request reached the real host
    # and the test passed with its fault never fired.
    project.makepyfile(
        """
        import pytest

        @pytest.mark.twice_mock(fault="lost_reply", unmocked="fail")
        def test_forgot_the_fixture():
            pass

        @pytest.mark.twice_mock(fault="lost_reply", assert_fault_fired=False)
        @pytest.mark.usefixtures("twice_mock")
        def test_uses_it_by_marker():
            pass
        """
    )
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*@pytest.mark.twice_mock on test_forgot_the_fixture does nothing without the "
         "twice_mock fixture*"]
    )  # fmt: skip


def test_plugin_leaves_the_tests_own_respx_routes_to_answer(project: pytest.Pytester) -> None:
    # The failing path: a request the test's own respx route answered was warned about as
    # gone "to the real network", and refused under unmocked='fail', breaking the test.
    project.makeconftest(CONFTEST)
    project.makepyfile(
        """
        import httpx
        import pytest
        import respx

        CRM = "https://crm.example.test/customers/c1"

        @pytest.mark.twice_mock(unmocked="fail", assert_fault_fired=False)
        @pytest.mark.parametrize("using", ["httpcore", "httpx"])
        def test_inside(twice_mock, using):
            with respx.mock(using=using) as rx:
                route = rx.get(CRM).respond(json={"email": "a@b.c"})
                assert httpx.get(CRM).json() == {"email": "a@b.c"}
            assert route.called and twice_mock.passed_through() == []

        @pytest.mark.twice_mock(unmocked="fail", assert_fault_fired=False)
        def test_fixture_first(respx_mock, twice_mock):
            respx_mock.get(CRM).respond(json={"email": "a@b.c"})
            assert httpx.get(CRM).json() == {"email": "a@b.c"}

        @pytest.mark.twice_mock(unmocked="fail", assert_fault_fired=False)
        def test_a_host_nobody_mocks_is_still_refused(twice_mock):
            with respx.mock(assert_all_called=False) as rx:
                rx.get(CRM).respond(json={})
                with pytest.raises(Exception, match="matched no mocked service"):
                    httpx.get("https://elsewhere.example.test/x")
        """
    )
    result = run_with_default_warnings(project, "-W", "error::UserWarning")
    # The last passes its body, and its refusal errors it at teardown (as documented).
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(["*test_a_host_nobody_mocks_is_still_refused*"])


def test_plugin_marker_is_registered_for_strict_markers(project: pytest.Pytester) -> None:
    result = project.runpytest(*PLUGIN, "--markers")
    result.stdout.fnmatch_lines(
        ["@pytest.mark.twice_mock(fault=..., assert_fault_fired=True, unmocked='fail'):*"]
    )


def test_plugin_docs_example_passes(pytester: pytest.Pytester) -> None:
    for path in sorted((EXAMPLES / "tool_code").glob("*.py")):
        pytester.makepyfile(**{path.stem: path.read_text(encoding="utf-8")})
    result = pytester.runpytest("--strict-markers")
    result.assert_outcomes(passed=4)


def test_plugin_docs_example_catches_a_naive_client(
    pytester: pytest.Pytester, readme_blocks: dict[str, str]
) -> None:
    # The same tests against the seed's bug (retry without a key) must fail.
    for path in sorted((EXAMPLES / "tool_code").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if path.stem == "payments_client":
            text = text.replace('headers={"Idempotency-Key": key},', "")
        pytester.makepyfile(**{path.stem: text})
    result = pytester.runpytest("--strict-markers")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        ["*expected exactly 1, observed 2 (re_1 at attempt 1, reply lost; re_2 at attempt 2)"]
    )
    # ...and the README shows that very output.
    shown = readme_blocks["output: naive payments_client.py"].splitlines()
    assert shown
    missing = [line for line in shown if line not in result.stdout.lines]
    assert not missing


# -- requests to hosts no service mocks ------------------------------------------------------

ELSEWHERE = """
import httpx
import pytest

def elsewhere(request):
    return httpx.Response(200, json={"id": "re_x"})

def call_other_host():
    # The client's own transport stands in for the network: a passed-through request reaches
    # it, so nothing leaves the machine.
    with httpx.Client(transport=httpx.MockTransport(elsewhere)) as client:
        return client.post("https://pay.example.org/v1/refunds", json={}).status_code
"""


def test_plugin_refuses_by_default_a_request_to_an_unmocked_host(
    project: pytest.Pytester,
) -> None:
    # A request no service mocks went to the real network with only a warning (it may reach
    # a real API); respx and pytest-httpx refuse one by default, and so does twice.
    project.makepyfile(
        ELSEWHERE
        + """
def test_default(twice_mock):
    call_other_host()
"""
    )
    result = run_with_default_warnings(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*UnmockedRequestError: twice: POST https://pay.example.org/v1/refunds matched no "
            "mocked service (https://payments.example.com); refused: host pay.example.org is "
            "not mocked. * To let requests to unmocked hosts through to the network, mark the "
            "test @pytest.mark.twice_mock(unmocked='warn') (or 'allow', silently), or set "
            "twice_unmocked = warn in the pytest ini options.",
        ]
    )


@pytest.mark.parametrize(
    ("marker", "ini"),
    [("@pytest.mark.twice_mock(unmocked='warn')", ""), ("", "[pytest]\ntwice_unmocked = warn\n")],
    ids=["marker", "ini"],
)
def test_plugin_opt_out_lets_a_request_to_an_unmocked_host_through_with_a_warning(
    project: pytest.Pytester, marker: str, ini: str
) -> None:
    project.makepyfile(
        ELSEWHERE
        + f"""
{marker}
def test_opted_out(twice_mock):
    assert call_other_host() == 200
"""
    )
    if ini:
        project.makeini(ini)
    result = run_with_default_warnings(project)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*UnmockedRequestWarning: twice: POST https://pay.example.org/v1/refunds matched no "
            "mocked service (https://payments.example.com) and went to the real network "
            "(unmocked='warn').*",
        ]
    )


def test_plugin_strict_mode_fails_a_request_to_an_unmocked_host(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(
        ELSEWHERE
        + """
from twice.assertions.pytest_plugin import UnmockedRequestError

@pytest.mark.twice_mock(unmocked="fail")
def test_strict(twice_mock):
    with pytest.raises(UnmockedRequestError, match="refused"):
        call_other_host()

@pytest.mark.twice_mock(unmocked="fail")
def test_strict_swallowed(twice_mock):
    try:
        call_other_host()
    except Exception:
        pass  # code under test that hides the refusal still fails the test

def test_allowed(twice_mock):
    assert call_other_host() == 200
"""
    )
    project.makeini("[pytest]\ntwice_unmocked = allow\n")
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=3, errors=2, warnings=0)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_strict*",
            "twice: 1 request(s) matched no mocked service and were refused: "
            "https://pay.example.org/v1/refunds. * To let requests to unmocked hosts through "
            "to the network, mark the test @pytest.mark.twice_mock(unmocked='warn')*",
        ]
    )


def test_plugin_strict_mode_from_the_ini_option(project: pytest.Pytester) -> None:
    project.makepyfile(
        ELSEWHERE
        + """
def test_strict_everywhere(twice_mock):
    call_other_host()
"""
    )
    project.makeini("[pytest]\ntwice_unmocked = fail\n")
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*UnmockedRequestError: twice: POST https://pay.example.org*"])


def test_plugin_bad_unmocked_mode_names_the_accepted_ones(project: pytest.Pytester) -> None:
    project.makepyfile(
        """
import pytest

@pytest.mark.twice_mock(unmocked="strict")
def test_typo(twice_mock):
    pass
"""
    )
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*twice: @pytest.mark.twice_mock(unmocked=...) must be one of fail, warn, allow, got "
         "'strict'*"]
    )  # fmt: skip


def test_plugin_matches_a_base_url_with_an_uppercase_host(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        CONFTEST.replace("https://payments.example.com", "https://Payments.Example.COM:443/")
    )
    pytester.makepyfile(
        """
import httpx
import pytest

@pytest.mark.twice_mock(fault="lost_reply", unmocked="fail")
def test_refund(twice_mock, ledger):
    body = {"order_id": "order_1042", "amount": 499}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post("https://Payments.Example.COM/v1/refunds", json=body)
    assert [e.id for e in ledger.effects] == ["re_1"]
    assert twice_mock.base_urls == ["https://payments.example.com"]
"""
    )
    pytester.runpytest(*PLUGIN).assert_outcomes(passed=1)


def test_plugin_fault_from_parametrize_and_marker_is_an_error(project: pytest.Pytester) -> None:
    project.makepyfile(
        """
import pytest

@pytest.mark.twice_mock(fault="lost_reply")
@pytest.mark.parametrize("twice_fault", ["error_before_commit"])
def test_both(twice_fault, twice_mock):
    pass
"""
    )
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*twice: the test sets its fault twice: parametrize('twice_fault') gives "
            "'error_before_commit' and @pytest.mark.twice_mock(fault=...) gives 'lost_reply'; "
            "keep one of them*",
        ]
    )


RETRYING_TRANSPORT = """
import uuid

import httpx
import pytest
from twice.assertions import assert_side_effects, exactly

URL = "https://payments.example.com/v1/refunds"
BODY = {"order_id": "order_1042", "amount": 499}


@pytest.mark.twice_mock(fault="lost_reply")
def test_sync_retrying_transport(ledger):
    with httpx.Client(transport=Retrying(httpx.HTTPTransport())) as client:
        client.post(URL, json=BODY, headers=HEADERS)
    assert_side_effects(ledger, exactly(1, "payments.refund.create", order_id="order_1042"))


@pytest.mark.twice_mock(fault="lost_reply")
def test_sync_client_of_a_sync_and_async_transport(ledger):
    with httpx.Client(transport=DualRetrying(httpx.HTTPTransport())) as client:
        client.post(URL, json=BODY, headers=HEADERS)
    assert_side_effects(ledger, exactly(1, "payments.refund.create", order_id="order_1042"))


@pytest.mark.twice_mock(fault="lost_reply")
def test_slotted_retrying_transport(ledger):
    with httpx.Client(transport=SlottedRetrying(httpx.HTTPTransport())) as client:
        client.post(URL, json=BODY, headers=HEADERS)
    assert_side_effects(ledger, exactly(1, "payments.refund.create", order_id="order_1042"))


@pytest.mark.twice_mock(fault="lost_reply")
def test_subclass_of_httpx_transport(ledger):
    with httpx.Client(transport=SubclassRetrying()) as client:
        client.post(URL, json=BODY, headers=HEADERS)
    assert_side_effects(ledger, exactly(1, "payments.refund.create", order_id="order_1042"))


@pytest.mark.anyio
@pytest.mark.twice_mock(fault="lost_reply")
async def test_async_retrying_transport(ledger):
    async with httpx.AsyncClient(transport=AsyncRetrying(httpx.AsyncHTTPTransport())) as client:
        await client.post(URL, json=BODY, headers=HEADERS)
    assert_side_effects(ledger, exactly(1, "payments.refund.create", order_id="order_1042"))
"""


@pytest.mark.parametrize("keyed", [False, True])
def test_plugin_runs_a_clients_own_retrying_transport(
    project: pytest.Pytester, retrying_transports: str, keyed: bool
) -> None:
    # The failing path: respx swapped the client's transport for its mock, so the retry in a
    # transport wrapping httpx's own never ran: one attempt, one refund, the test passed where
    # production (the same client against `twice serve`) made two refunds.
    headers = '{"Idempotency-Key": uuid.uuid4().hex}' if keyed else "{}"
    project.makepyfile(RETRYING_TRANSPORT.replace("HEADERS)", f"{headers})") + retrying_transports)
    result = project.runpytest(*PLUGIN)
    if keyed:  # one key for the request, so every retry of it is a replay
        result.assert_outcomes(passed=5)
        return
    result.assert_outcomes(failed=5)
    result.stdout.fnmatch_lines(
        ["*expected exactly 1, observed 2 (re_1 at attempt 1, reply lost; re_2 at attempt 2)*"]
    )
    # Count the failure sections' "E" lines only: under CI=1 pytest prints each whole message
    # again in the short summary, so a count over all of stdout doubles there.
    reported = [line for line in result.outlines if line.startswith("E") and "observed 2" in line]
    assert len(reported) == 5
