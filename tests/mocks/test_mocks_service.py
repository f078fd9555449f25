"""The payments service, its idempotency-key rules (Stripe v1 / IETF) and the six faults."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import threading

import httpx
import pytest
from twice.mocks import (
    CRASH_HEADER,
    FAULTS,
    REPLAYED_HEADER,
    Attempt,
    Call,
    CrashAfterCommit,
    ErrorAfterCommit,
    LostReply,
    PaymentsService,
    Schedule,
    ServerErrorAfterCommit,
    Services,
    TimeoutBeforeCommit,
    get_fault,
    services_from_state,
)

URL = "https://payments.twice.test/v1/refunds"
ORDER = {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997}
BODY = {"order_id": "order_1042", "amount": 499}


def services(fault: object = None) -> Services:
    return Services([PaymentsService(orders=[ORDER])], fault=fault)  # type: ignore[arg-type]


async def post(
    s: Services, key: str | None = None, body: dict[str, object] = BODY
) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    async with s.client() as client:
        return await client.post(URL, json=body, headers=headers)


def test_service_creates_refund_and_records_attempt_and_effect() -> None:
    s = services()
    r = asyncio.run(post(s))
    assert r.status_code == 200 and r.json()["id"] == "re_1"
    (attempt,) = s.ledger.attempts
    assert (attempt.route, attempt.mutating, attempt.outcome, attempt.delivered) == (
        "payments.refund.create", True, "ok", True,
    )  # fmt: skip
    assert [e.id for e in s.ledger.effects] == ["re_1"]
    assert s.ledger.effects[0].fields == {"order_id": "order_1042", "amount": 499, "reason": ""}


def test_service_rejects_refund_past_balance() -> None:
    s = services()
    r = asyncio.run(post(s, body={"order_id": "order_1042", "amount": 5000}))
    assert r.status_code == 400 and "refundable balance" in r.json()["error"]["message"]
    assert s.ledger.effects == []


def test_a_refund_naming_no_order_is_a_400_naming_the_params() -> None:
    # It was a 404 "No such order: None", which names neither what is missing nor its names.
    s = services()
    r = asyncio.run(post(s, body={"amount": 499}))
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "payment_intent" in message and "None" not in message
    assert s.ledger.effects == []


def test_unknown_path_is_recorded_as_404() -> None:
    s = services()

    async def go() -> httpx.Response:
        async with s.client() as client:
            return await client.get("https://payments.twice.test/v2/nothing")

    r = asyncio.run(go())
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "the payments API has no endpoint GET /v2/nothing"
    assert s.ledger.attempts[0].route is None


def test_unknown_host_404_names_the_whole_url() -> None:
    s = services()

    async def go() -> httpx.Response:
        async with s.client() as client:
            return await client.get("https://payment.twice.test/v1/refunds?limit=1")

    r = asyncio.run(go())
    assert r.status_code == 404
    assert r.json()["error"]["message"] == (
        "no such endpoint: GET https://payment.twice.test/v1/refunds?limit=1"
    )


def test_key_replays_saved_response_without_new_effect() -> None:
    s = services()
    first, second = asyncio.run(post(s, "k")), asyncio.run(post(s, "k"))
    assert first.json() == second.json()
    assert len(s.ledger.effects) == 1 and s.ledger.attempts[1].replayed


def test_key_with_different_parameters_is_422() -> None:
    s = services()
    asyncio.run(post(s, "k"))
    r = asyncio.run(post(s, "k", body={"order_id": "order_1042", "amount": 498}))
    assert r.status_code == 422 and "different parameters" in r.json()["error"]["message"]
    assert len(s.ledger.effects) == 1


def test_key_in_flight_is_409_and_not_saved() -> None:
    s = services()

    async def both() -> list[httpx.Response]:
        async with s.client() as client:
            return list(
                await asyncio.gather(
                    client.post(URL, json=BODY, headers={"Idempotency-Key": "k"}),
                    client.post(URL, json=BODY, headers={"Idempotency-Key": "k"}),
                )
            )

    statuses = sorted(r.status_code for r in asyncio.run(both()))
    assert statuses == [200, 409]
    assert len(s.ledger.effects) == 1
    # The 409 was not saved: a later retry gets the first request's saved response.
    assert asyncio.run(post(s, "k")).json()["id"] == "re_1"


def test_concurrent_without_key_commits_twice() -> None:
    s = services()

    async def both() -> None:
        async with s.client() as client:
            await asyncio.gather(client.post(URL, json=BODY), client.post(URL, json=BODY))

    asyncio.run(both())
    assert [e.id for e in s.ledger.effects] == ["re_1", "re_2"]


def test_key_over_255_characters_is_rejected() -> None:
    s = services()
    r = asyncio.run(post(s, "k" * 256))
    assert r.status_code == 400 and "at most 255" in r.json()["error"]["message"]
    assert s.ledger.effects == []
    assert asyncio.run(post(s, "k" * 255)).status_code == 200


def test_key_on_get_is_ignored() -> None:
    s = services()

    async def go() -> httpx.Response:
        async with s.client() as client:
            return await client.get(
                URL, params={"order_id": "order_1042"}, headers={"Idempotency-Key": "k"}
            )

    assert asyncio.run(go()).status_code == 200
    assert len(s["payments"].keys) == 0


def test_validation_failure_is_not_saved() -> None:
    s = services()
    bad = asyncio.run(post(s, "k", body={"order_id": "order_1042", "amount": 99999}))
    assert bad.status_code == 400
    assert len(s["payments"].keys) == 0


def test_gateway_error_after_commit_leaves_the_saved_200_for_a_keyed_retry() -> None:
    # The 502 came from a gateway: the service saved its own 200, which the retry replays.
    s = services(ErrorAfterCommit())
    first = asyncio.run(post(s, "k"))
    again = asyncio.run(post(s, "k"))
    assert first.status_code == 502
    assert again.status_code == 200 and again.json()["id"] == "re_1"
    assert again.headers[REPLAYED_HEADER] == "true" and s.ledger.attempts[1].replayed
    assert len(s.ledger.effects) == 1


def test_server_error_after_commit_saves_and_replays_the_500() -> None:
    # The service itself answered 500 after committing; Stripe saves that answer.
    s = services(ServerErrorAfterCommit())
    first = asyncio.run(post(s, "k"))
    again = asyncio.run(post(s, "k"))
    assert first.status_code == again.status_code == 500
    assert again.json() == first.json() and s.ledger.attempts[1].replayed
    assert len(s.ledger.effects) == 1  # committed once, though the client never saw success


def test_only_a_replay_carries_the_replayed_header() -> None:
    s = services()
    first, again = asyncio.run(post(s, "k")), asyncio.run(post(s, "k"))
    assert REPLAYED_HEADER not in first.headers
    assert again.headers[REPLAYED_HEADER] == "true"


class _Boom(RuntimeError):
    pass


def _raising_service(*, commit_first: bool) -> Services:
    class Flaky(PaymentsService):
        calls = 0

        def create_refund(self, call: Call) -> httpx.Response:
            Flaky.calls += 1
            if Flaky.calls == 1:
                if commit_first:
                    call.commit("payments.refund.create", "re", dict(call.params))
                raise _Boom("handler bug")
            return super().create_refund(call)

    return Services([Flaky(orders=[ORDER])])


def test_handler_that_raises_frees_its_key_and_records_an_unknown_outcome() -> None:
    s = _raising_service(commit_first=False)
    with pytest.raises(_Boom):
        asyncio.run(post(s, "k"))
    first = s.ledger.attempts[0]
    assert (first.outcome, first.delivered, first.status) == ("unknown", False, None)
    # Nothing was done, so the key is free: the retry runs (no 409 forever).
    again = asyncio.run(post(s, "k"))
    assert again.status_code == 200 and not s.ledger.attempts[1].replayed


def test_handler_that_raises_after_committing_saves_a_500() -> None:
    s = _raising_service(commit_first=True)
    with pytest.raises(_Boom):
        asyncio.run(post(s, "k"))
    again = asyncio.run(post(s, "k"))
    # The half-done work is never redone under that key: its retry gets the saved 500.
    assert again.status_code == 500 and s.ledger.attempts[1].replayed
    assert len(s.ledger.effects) == 1


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and every exception behind it, stopping at the first repeat."""
    seen: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and all(link is not s for s in seen):
        seen.append(link)
        link = link.__cause__ or link.__context__
    if link is not None:
        raise AssertionError(f"{error!r}'s cause chain loops back to {link!r}")
    return seen


def test_a_handler_exception_reaches_the_client_without_a_cause_cycle() -> None:
    # The failing path: respx raised the handler's exception from its own wrapper, whose cause
    # is that exception again; rich's traceback printer walked the loop for ever and a bug in
    # a service handler hung `twice run`.
    s = _raising_service(commit_first=False)
    with pytest.raises(_Boom) as raised:
        asyncio.run(post(s, "k"))
    assert [type(e) for e in _chain(raised.value)] == [_Boom]

    blocking = _raising_service(commit_first=False)
    request = httpx.Request("POST", URL, json=BODY)
    with pytest.raises(_Boom) as raised:
        blocking.dispatch(request)
    assert [type(e) for e in _chain(raised.value)] == [_Boom]


def test_a_handler_exception_keeps_the_cause_it_was_raised_with() -> None:
    class Chained(PaymentsService):
        def create_refund(self, call: Call) -> httpx.Response:
            try:
                raise KeyError("order_1042")
            except KeyError as missing:
                raise _Boom("handler bug") from missing

    for sync in (False, True):
        s = Services([Chained(orders=[ORDER])])
        with pytest.raises(_Boom) as raised:
            if sync:
                s.dispatch(httpx.Request("POST", URL, json=BODY))
            else:
                asyncio.run(post(s))
        assert [type(e) for e in _chain(raised.value)] == [_Boom, KeyError]


def test_a_handler_committing_under_another_name_than_its_route_is_an_error() -> None:
    # The failing path: 'payments.refund.created' on the route 'payments.refund.create' was
    # recorded, and the intent on the route's name counted nothing: two refunds made, 0%
    # duplicated and 0% completed.
    class Misnamed(PaymentsService):
        def create_refund(self, call: Call) -> httpx.Response:
            call.commit("payments.refund.created", "re", {"order_id": "order_1042"})
            return httpx.Response(200, json={"id": "re_1"})

    s = Services([Misnamed(orders=[ORDER])])
    with pytest.raises(ValueError, match=r"route 'payments.refund.create' committed an effect "
                       r"named 'payments.refund.created'"):  # fmt: skip
        asyncio.run(post(s))
    assert s.ledger.effects == []


def test_a_commit_records_its_effect_and_the_handler_sees_the_request() -> None:
    seen: list[httpx.Request] = []

    class Watching(PaymentsService):
        def create_refund(self, call: Call) -> httpx.Response:
            seen.append(call.request)
            return super().create_refund(call)

    s = Services([Watching(orders=[ORDER])])
    asyncio.run(post(s))
    asyncio.run(post(s))
    assert [str(r.url) for r in seen] == [URL, URL]
    first, second = s.ledger.effects
    assert (first.id, first.name, first.attempt) == ("re_1", "payments.refund.create", 1)
    assert (second.id, second.name, second.attempt) == ("re_2", "payments.refund.create", 2)
    assert [a.effect_ids for a in s.ledger.attempts] == [["re_1"], ["re_2"]]


def test_a_misnamed_commit_names_the_service_class_and_the_call_to_make() -> None:
    class Misnamed(PaymentsService):
        def create_refund(self, call: Call) -> httpx.Response:
            call.commit("payments.refund.created", "re", {})
            return httpx.Response(200)

    with pytest.raises(ValueError) as raised:
        asyncio.run(post(Services([Misnamed(orders=[ORDER])])))
    assert str(raised.value) == (
        "Misnamed: the handler of route 'payments.refund.create' committed an effect named "
        "'payments.refund.created'; a route commits effects under its own name "
        "(call.commit('payments.refund.create', ...))"
    )


def test_a_service_outside_a_set_has_no_ledger_and_says_so() -> None:
    with pytest.raises(RuntimeError, match=r"^PaymentsService is not part of a Services set yet$"):
        _ = PaymentsService().ledger


def test_a_services_error_response_is_the_stripe_shape_with_its_type() -> None:
    service = PaymentsService()
    default = service.error_response(400, "no such order")
    assert default.status_code == 400
    assert default.json() == {
        "error": {"type": "invalid_request_error", "message": "no such order"}
    }
    own = service.error_response(500, "boom", type="api_error")
    assert own.json() == {"error": {"type": "api_error", "message": "boom"}}


def test_services_from_state_gives_each_service_its_own_keys() -> None:
    from twice.mocks import TicketsService

    state = {"orders": [ORDER]}
    payments, tickets = services_from_state(state, PaymentsService, TicketsService)
    assert isinstance(payments, PaymentsService) and isinstance(tickets, TicketsService)
    s = Services([payments, tickets])
    assert asyncio.run(post(s)).status_code == 200  # the order went to payments


def test_services_from_state_names_an_unknown_key_and_the_accepted_ones() -> None:
    from twice.mocks import TicketsService

    with pytest.raises(ValueError) as raised:
        services_from_state({"order": [], "zz": 1}, PaymentsService, TicketsService)
    accepted = ", ".join(
        sorted(
            n
            for kind in (PaymentsService, TicketsService)
            for n in inspect.signature(kind).parameters
            if n != "base_url"
        )
    )
    assert str(raised.value) == (
        "unknown state key(s) 'order', 'zz' for PaymentsService, TicketsService; accepted: "
        + accepted
    )


def test_two_routes_of_one_name_are_refused_when_the_services_are_built() -> None:
    # The failing path: the router keeps one route per name, so a second route named like
    # the first silently replaced it: the first's requests were 404s ("no endpoint"), and a
    # careful agent's lookup failing made it resend (100% duplicated, exit 0).
    from twice.mocks import Route

    class Doubled(PaymentsService):
        def routes(self) -> list[Route]:
            mine = Route("PUT", r"/v1/refunds", "payments.refund.list", self.list_refunds)
            return [*super().routes(), mine]

    with pytest.raises(ValueError) as raised:
        Services([Doubled(orders=[ORDER])])
    assert str(raised.value) == (
        "two routes named 'payments.refund.list' (GET /v1/refunds and PUT /v1/refunds); "
        "each route needs a name of its own"
    )


def test_a_route_named_like_the_routers_catch_all_is_refused() -> None:
    # The failing path: the catch-all, added after the services' routes, replaced it: every
    # request to it was a 404 "no endpoint", with no error.
    from twice.mocks import Route

    class Shadowed(PaymentsService):
        def routes(self) -> list[Route]:
            return [*super().routes(), Route("GET", r"/v1/x", "unmatched", self.list_refunds)]

    with pytest.raises(ValueError) as raised:
        Services([Shadowed(orders=[ORDER])])
    assert str(raised.value) == (
        "route name 'unmatched' (GET /v1/x) is the router's own catch-all; "
        "give the route another name"
    )


def test_sync_path_serves_threads_one_request_at_a_time() -> None:
    # Switch threads as often as possible, so an unserialised path races within a few rounds.
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for round_no in range(200):
            s = services(LostReply(schedule=Schedule(attempts=(3,))))
            barrier = threading.Barrier(8)

            def send(s: Services = s, barrier: threading.Barrier = barrier) -> None:
                with s.sync_client() as client:
                    barrier.wait()
                    with contextlib.suppress(httpx.ReadTimeout):
                        client.post(URL, json={"order_id": "order_1042", "amount": 1})

            threads = [threading.Thread(target=send) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            numbers = [a.n for a in s.ledger.attempts]
            assert sorted(numbers) == list(range(1, 9)), f"round {round_no}: {numbers}"
            fired = [a.n for a in s.ledger.faults_fired()]
            assert fired == [3], f"round {round_no}: fault hit attempts {fired}"
            assert len(s.ledger.effects) == 8
    finally:
        sys.setswitchinterval(old)


@pytest.mark.parametrize(
    ("name", "commits", "client_sees"),
    [
        ("none", True, 200),
        ("lost_reply", True, "timeout"),
        ("reset_after_commit", True, "reset"),
        ("timeout_before_commit", False, "timeout"),
        ("error_after_commit", True, 502),
        ("server_error_after_commit", True, 500),
        ("error_before_commit", False, 503),
        ("rate_limited", False, 429),
    ],
)
def test_fault_commit_and_what_client_sees(name: str, commits: bool, client_sees: object) -> None:
    fault = get_fault(name)
    assert fault.commits is commits
    s = services(fault)
    try:
        seen: object = asyncio.run(post(s)).status_code
    except httpx.ReadTimeout:
        seen = "timeout"
    except httpx.RemoteProtocolError as ex:  # as from a real server that closed, no reply
        assert str(ex) == "Server disconnected without sending a response."
        seen = "reset"
    assert seen == client_sees
    assert len(s.ledger.effects) == (1 if commits else 0)
    (attempt,) = s.ledger.attempts
    assert attempt.fault == (None if name == "none" else name)
    assert attempt.outcome == {200: "ok", 429: "fail"}.get(seen, "unknown")  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("name", "status", "message"),
    [
        ("error_after_commit", 502, "Bad gateway: the upstream connection was reset"),
        ("server_error_after_commit", 500, "Internal server error while finishing the request"),
        ("error_before_commit", 503, "Service unavailable, try again later"),
        ("rate_limited", 429, "Too many requests"),
    ],
)
def test_an_error_fault_replies_with_a_stripe_error_body(
    name: str, status: int, message: str
) -> None:
    # What a tool shows the model: the same error shape as the service's own errors.
    r = asyncio.run(post(services(get_fault(name))))
    assert r.status_code == status
    assert r.json() == {"error": {"type": "api_error", "message": message}}


@pytest.mark.parametrize(
    ("name", "error", "text"),
    [
        ("lost_reply", httpx.ReadTimeout, "timed out waiting for the response"),
        ("timeout_before_commit", httpx.ReadTimeout, "timed out waiting for the response"),
        ("reset_after_commit", httpx.RemoteProtocolError, "Server disconnected"),
    ],
)
def test_a_transport_fault_raises_for_the_request_that_was_sent(
    name: str, error: type[httpx.TransportError], text: str
) -> None:
    # As httpx raises them: the error carries its request, which a retry loop reads.
    with pytest.raises(error) as info:
        asyncio.run(post(services(get_fault(name))))
    assert str(info.value).startswith(text)
    assert str(info.value.request.url) == URL and info.value.request.method == "POST"


def test_a_schedule_counts_only_mutating_attempts_on_its_route() -> None:
    def attempt(route: str, mutating: bool) -> Attempt:
        return Attempt(
            n=1, service="payments", method="POST" if mutating else "GET", path="/v1/refunds",
            route=route, mutating=mutating, key=None, params={}, source="initial", status=200,
        )  # fmt: skip

    refund = "payments.refund.create"
    assert Schedule().matches(attempt(refund, True))
    assert not Schedule().matches(attempt("payments.refund.list", False))
    assert not Schedule(route=refund).matches(attempt("payments.charge.create", True))


def test_the_crash_fault_replies_as_the_service_did_marked_as_a_crash() -> None:
    request = httpx.Request("POST", URL)
    reply = httpx.Response(201, json={"id": "re_1"})
    crashed = CrashAfterCommit().after_commit(request, reply)
    assert (crashed.status_code, crashed.content) == (201, reply.content)
    assert crashed.headers["Content-Type"] == "application/json"
    assert crashed.headers[CRASH_HEADER] == "after_commit"


def test_a_fault_on_every_attempt_of_any_route_leaves_reads_alone() -> None:
    s = services(TimeoutBeforeCommit(schedule=Schedule(every=True)))

    async def read() -> httpx.Response:
        async with s.client() as client:
            return await client.get(URL, params={"order_id": "order_1042"})

    assert asyncio.run(read()).status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        asyncio.run(post(s))
    assert [a.fault for a in s.ledger.attempts] == [None, "timeout_before_commit"]


def test_rate_limited_sends_retry_after() -> None:
    s = services(get_fault("rate_limited"))
    assert asyncio.run(post(s)).headers["Retry-After"] == "2"


def test_fault_hits_only_first_mutating_attempt_by_default() -> None:
    s = services(LostReply())
    with pytest.raises(httpx.ReadTimeout):
        asyncio.run(post(s))
    assert asyncio.run(post(s)).status_code == 200
    assert [a.fault for a in s.ledger.attempts] == ["lost_reply", None]


@pytest.mark.parametrize(
    "name", ["lost_reply", "reset_after_commit", "error_after_commit", "server_error_after_commit"]
)
def test_a_commit_fault_passes_over_a_request_that_did_no_work(name: str) -> None:
    # An agent whose first call was malformed (a 400, or refused for its key) used up the
    # fault on it: its real call then ran fault-free, and the trial scored it safe.
    s = services(get_fault(name))
    bad = asyncio.run(post(s, body={"order_id": "order_1042", "amount": 5000}))
    assert bad.status_code == 400  # past the balance: not executed, its reply delivered
    with contextlib.suppress(httpx.ReadTimeout, httpx.RemoteProtocolError):
        assert asyncio.run(post(s)).status_code != 200  # the fault hits the real call
    assert [a.fault for a in s.ledger.attempts] == [None, name]
    assert len(s.ledger.effects) == 1
    assert asyncio.run(post(s)).status_code == 200  # and only once
    assert [a.fault for a in s.ledger.attempts][2] is None


@pytest.mark.parametrize(
    ("content", "kind", "said"),
    [
        (b"{not json", "application/json", "neither JSON nor form data"),
        (b"[1, 2]", "application/json", "JSON object of parameters"),
        # A form body with a raw byte that is not UTF-8 was a 500 (UnicodeDecodeError).
        (b"order_id=order_1042&x=\xff", "application/x-www-form-urlencoded", "not UTF-8"),
    ],
)
def test_a_body_that_is_not_parameters_is_a_400_saying_so(
    content: bytes, kind: str, said: str
) -> None:
    # It was read as no parameters at all: "No such order: None" (404), and a lost_reply
    # scheduled on it was spent.
    s = services(LostReply())

    async def send() -> httpx.Response:
        async with s.client() as client:
            return await client.post(URL, content=content, headers={"content-type": kind})

    r = asyncio.run(send())
    assert r.status_code == 400 and said in r.json()["error"]["message"]
    with pytest.raises(httpx.ReadTimeout):
        asyncio.run(post(s))  # the fault waits for a request that does work
    assert s.ledger.attempts[0].status == 400 and len(s.ledger.effects) == 1


def test_a_fault_before_the_work_still_hits_the_first_request() -> None:
    # Nothing is done either way before a pre-commit fault: it keeps its scheduled attempt.
    s = services(TimeoutBeforeCommit())
    with pytest.raises(httpx.ReadTimeout):
        asyncio.run(post(s, body={"order_id": "order_1042", "amount": 5000}))
    assert asyncio.run(post(s)).status_code == 200


def test_fault_schedule_every_and_route_filter() -> None:
    s = services(TimeoutBeforeCommit(schedule=Schedule(every=True, route="payments.refund.create")))
    for _ in range(3):
        with pytest.raises(httpx.ReadTimeout):
            asyncio.run(post(s))
    assert s.ledger.effects == [] and len(s.ledger.faults_fired()) == 3


def test_key_released_after_timeout_before_commit() -> None:
    s = services(TimeoutBeforeCommit())
    with pytest.raises(httpx.ReadTimeout):
        asyncio.run(post(s, "k"))
    # Nothing began executing, so the key is free and the retry does the work.
    r = asyncio.run(post(s, "k"))
    assert r.status_code == 200 and not s.ledger.attempts[1].replayed


def test_sync_client_shares_the_ledger() -> None:
    s = services()
    with s.sync_client() as client:
        assert client.post(URL, json=BODY).status_code == 200
    assert len(s.ledger.effects) == 1


def test_trials_are_isolated() -> None:
    a, b = services(LostReply()), services()

    async def go() -> None:
        async with a.client() as ca, b.client() as cb:
            await asyncio.gather(
                ca.post(URL, json=BODY), cb.post(URL, json=BODY), return_exceptions=True
            )

    asyncio.run(go())
    assert len(a.ledger.attempts) == len(b.ledger.attempts) == 1
    assert a.ledger.effects[0].id == b.ledger.effects[0].id == "re_1"


def test_get_fault_names_accepted_values() -> None:
    with pytest.raises(ValueError, match=r"unknown fault 'lost'.*lost_reply") as info:
        get_fault("lost")
    # The accepted names as a list a reader can copy from.
    assert "expected one of: none, lost_reply, reset_after_commit, " in str(info.value)
    assert set(FAULTS) == {
        "none", "lost_reply", "reset_after_commit", "timeout_before_commit", "error_after_commit",
        "error_before_commit", "rate_limited", "crash_after_commit", "server_error_after_commit",
    }  # fmt: skip


def test_ledger_of_a_sample_without_a_ledger_says_so() -> None:
    from types import SimpleNamespace

    from twice.mocks import LEDGER_STORE_KEY, Ledger, ledger_of, ledgers

    good = SimpleNamespace(id="s1", store={LEDGER_STORE_KEY: Ledger().to_dict()})
    assert ledgers(SimpleNamespace(samples=[good, good])) == [Ledger(), Ledger()]
    with pytest.raises(LookupError, match="sample 's2' has no ledger"):
        ledger_of(SimpleNamespace(id="s2", store={}))


def _cookie_service() -> Services:
    """Payments whose refund reply sets a session cookie (real APIs do; the mocks do not)."""

    class WithSession(PaymentsService):
        def create_refund(self, call: Call) -> httpx.Response:
            response = super().create_refund(call)
            response.headers["Set-Cookie"] = "session=s_1; Path=/"
            return response

    return Services([WithSession(orders=[ORDER])])


def test_clients_keep_a_cookie_a_service_sets_and_send_it_back() -> None:
    # The clients read a response's cookies only when it sets one (a CPU saving): one that
    # does is read as httpx reads it, and the cookie goes out with the next request.
    s = _cookie_service()

    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Cookies]:
        async with s.client() as client:
            plain = await client.get("https://payments.twice.test/v1/refunds")
            assert not client.cookies
            await client.post(URL, json=BODY)
            again = await client.get("https://payments.twice.test/v1/refunds")
            return plain, again, client.cookies

    plain, again, cookies = asyncio.run(go())
    assert dict(cookies) == {"session": "s_1"}
    assert "cookie" not in plain.request.headers
    assert again.request.headers["cookie"] == "session=s_1"
    with s.sync_client() as client:
        client.post(URL, json=BODY)
        assert (
            client.get("https://payments.twice.test/v1/refunds").request.headers["cookie"]
            == "session=s_1"
        )


# -- a key after a fault before the commit, and malformed keys, in process ---------------------


@pytest.mark.parametrize(("name", "status"), [("error_before_commit", 503), ("rate_limited", 429)])
def test_a_keyed_retry_after_a_refusal_before_the_commit_runs_afresh(
    name: str, status: int
) -> None:
    # The 503/429 came before any work began: the key must be free, or the client's keyed
    # retry (what Stripe's SDK does after a 503 or 429) gets 409 "in progress" for good.
    s = services(get_fault(name))
    first = asyncio.run(post(s, "k"))
    assert first.status_code == status and s.ledger.effects == []
    assert len(s["payments"].keys) == 0  # no reservation left behind
    for _ in range(2):  # the retry does the work once; a second retry replays it
        again = asyncio.run(post(s, "k"))
        assert again.status_code == 200, again.text
        assert again.json()["id"] == "re_1"
    assert [a.replayed for a in s.ledger.attempts] == [False, False, True]
    assert [a.status for a in s.ledger.attempts] == [status, 200, 200]
    assert [e.id for e in s.ledger.effects] == ["re_1"]


def test_a_keyed_request_in_flight_after_a_refusal_is_still_409() -> None:
    # Freeing the key after a refusal must not free it while the retry that holds it runs.
    s = services(get_fault("error_before_commit"))
    assert asyncio.run(post(s, "k")).status_code == 503

    async def both() -> list[httpx.Response]:
        async with s.client() as client:
            return list(
                await asyncio.gather(
                    client.post(URL, json=BODY, headers={"Idempotency-Key": "k"}),
                    client.post(URL, json=BODY, headers={"Idempotency-Key": "k"}),
                )
            )

    assert sorted(r.status_code for r in asyncio.run(both())) == [200, 409]
    assert len(s.ledger.effects) == 1


@pytest.mark.parametrize(
    ("key", "said"),
    [
        (b"", "Idempotency-Key is empty"),
        (b"k\xe9y", "Idempotency-Key is 'k\xe9y', not printable ASCII"),
        (b"k\x7fy", "Idempotency-Key is 'k\\x7fy', not printable ASCII"),
        (b"k\ty", "Idempotency-Key is 'k\\ty', not printable ASCII"),
    ],
)
def test_a_malformed_key_is_a_400_in_process(key: bytes, said: str) -> None:
    # The same rule as over a socket (twice serve): an empty key sent on every request would
    # replay the first reply to all of them, and the client would be scored idempotent.
    s = services()

    async def send() -> httpx.Response:
        async with s.client() as client:
            return await client.post(URL, json=BODY, headers=[(b"Idempotency-Key", key)])

    for _ in range(2):
        r = asyncio.run(send())
        assert r.status_code == 400, r.text
        assert said in r.json()["error"]["message"]
    assert s.ledger.effects == [] and len(s["payments"].keys) == 0
    assert asyncio.run(post(s, "k")).status_code == 200  # a good key still works


@pytest.mark.parametrize("key", ["", "k\xe9y", "k\x7fy", "k\ny", "k" * 256])
def test_the_store_refuses_a_malformed_key_without_reserving_it(key: str) -> None:
    from twice.mocks import IdempotencyStore

    store = IdempotencyStore()
    kind = "too_long" if len(key) > 255 else "malformed"
    assert store.begin(key, "fp").kind == kind
    assert store.begin(key, "fp").kind == kind  # never "in_flight": nothing was reserved
    assert len(store) == 0
    assert store.begin("k" * 255, "fp").kind == "new"
    assert store.begin("~ !k", "fp").kind == "new"  # printable ASCII, spaces included


def test_a_keyed_retry_with_its_parameters_in_another_order_is_a_replay() -> None:
    # The same parameters are the same request, whatever order a client serialised them in
    # (an SDK's retry may rebuild the body): a replay, not a 422 for different parameters.
    s = services()
    first = asyncio.run(post(s, "k", body={"order_id": "order_1042", "amount": 499}))
    again = asyncio.run(post(s, "k", body={"amount": 499, "order_id": "order_1042"}))
    assert again.status_code == 200, again.text
    assert again.json() == first.json() and s.ledger.attempts[1].replayed
    assert len(s.ledger.effects) == 1


def test_the_store_decisions_carry_the_saved_row() -> None:
    from twice.mocks import IdempotencyStore

    store = IdempotencyStore()
    new = store.begin("k", "fp")
    assert new.kind == "new" and new.saved is not None and new.saved.state == "in_flight"
    busy = store.begin("k", "fp")
    assert busy.kind == "in_flight" and busy.saved is new.saved
    clash = store.begin("k", "other")
    assert clash.kind == "conflict" and clash.saved is new.saved
    store.save("k", 201, {"id": "re_1"})
    assert (new.saved.state, new.saved.status, new.saved.body) == ("done", 201, {"id": "re_1"})
    replay = store.begin("k", "fp")
    assert replay.kind == "replay" and replay.saved is new.saved
    store.release("k")
    assert len(store) == 0 and store.begin("k", "fp").kind == "new"
    store.release("never reserved")  # nothing to forget: not an error
    assert len(store) == 1
