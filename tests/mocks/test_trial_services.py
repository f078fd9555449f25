"""A trial's services (``Services``): the attempt each request leaves in the ledger, the shared
router, the request pipeline around the commit (keys, faults, replays) and the transport.

These read every field a request leaves behind, because each is a number or a word some
metric, verdict or report reads: a source or call number recorded wrong is a retry attributed
to the wrong sender, a status or outcome recorded wrong an unknown outcome scored as known.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import time
import uuid
from typing import Any, ClassVar

import httpx
import pytest
from twice.mocks import (
    BACKOFF_HEADER,
    CALL_HEADER,
    REPLAYED_HEADER,
    SOURCE_HEADER,
    Call,
    EmailService,
    ErrorBeforeCommit,
    Fault,
    LostReply,
    PaymentsService,
    Route,
    Schedule,
    ServerErrorAfterCommit,
    Service,
    Services,
    TicketsService,
    TimeoutBeforeCommit,
    get_fault,
)

REFUNDS = "https://payments.twice.test/v1/refunds"
ORDERS = [
    {"order_id": "order_1042", "customer": "Dana Ortiz", "amount": 3997},
    {"order_id": "order_1054", "customer": "Sam Lee", "amount": 9850},
]
BODY = {"order_id": "order_1042", "amount": 499}


def payments(fault: Any = None) -> Services:
    return Services([PaymentsService(orders=ORDERS)], fault=fault)


async def _send(
    s: Services, method: str, url: str, headers: dict[str, str] | None = None, **kwargs: Any
) -> httpx.Response:
    async with s.client() as client:
        return await client.request(method, url, headers=headers, **kwargs)


def send(
    s: Services, method: str, url: str, headers: dict[str, str] | None = None, **kwargs: Any
) -> httpx.Response:
    """One request through the trial's async client (the path twice's tools take)."""
    return asyncio.run(_send(s, method, url, headers, **kwargs))


def refund(
    s: Services, key: str | None = None, body: dict[str, Any] = BODY, **headers: str
) -> httpx.Response:
    sent = dict(headers)
    if key is not None:
        sent["Idempotency-Key"] = key
    return send(s, "POST", REFUNDS, sent, json=body)


def record(attempt: Any) -> dict[str, Any]:
    """An attempt's fields, but its wall-clock time."""
    return {k: v for k, v in dataclasses.asdict(attempt).items() if k != "at"}


class Things(Service):
    """A service whose handler answers with the status the request asks for: the pipeline's
    boundaries (a 4xx, a 5xx, a reply with no body) without a real service's rules.

    Each instance lives at a base URL of its own, so a set holding one has a layout no other
    test built: the router it runs through is built in the test, not taken from the cache
    of an earlier one (which would hide a change to how routers are built, and to their
    side effects, from every test but the first of a process).
    """

    name: ClassVar[str] = "things"

    def __init__(self, base_url: str | None = None) -> None:
        super().__init__(base_url or f"https://things-{uuid.uuid4().hex[:12]}.twice.test")

    def routes(self) -> list[Route]:
        return [
            Route("POST", r"/v1/things", "things.thing.create", self.create, mutating=True),
            Route(
                "DELETE",
                r"/v1/things/(?P<thing_id>[^/?]+)",
                "things.thing.delete",
                self.delete,
                mutating=True,
            ),
            Route("GET", r"/v1/things", "things.thing.list", self.list),
            Route("PUT", r"/v1/things", "things.thing.replace", self.replace, mutating=True),
            Route("POST", r"/v1/widgets", "things.widget.create", self.widget, mutating=True),
        ]

    def create(self, call: Call) -> httpx.Response:
        status = int(call.params.get("status", 200))
        if status < 400 or call.params.get("commit"):
            effect = call.commit("things.thing.create", "th", {"status": status})
            if status == 204:
                return httpx.Response(204)
            return httpx.Response(status, json={"id": effect.id, "status": status})
        return httpx.Response(status, json={"error": {"type": "x", "message": f"said {status}"}})

    def delete(self, call: Call) -> httpx.Response:
        call.commit("things.thing.delete", "del", {"thing_id": call.params["thing_id"]})
        return httpx.Response(204)

    def list(self, call: Call) -> httpx.Response:
        return httpx.Response(200, json={"data": []})

    def replace(self, call: Call) -> httpx.Response:
        effect = call.commit("things.thing.replace", "rp", dict(call.params))
        return httpx.Response(200, json={"id": effect.id})

    def widget(self, call: Call) -> httpx.Response:
        effect = call.commit("things.widget.create", "wd", dict(call.params))
        return httpx.Response(200, json={"id": effect.id})


def url(s: Services, path: str = "/v1/things") -> str:
    """``path`` on the set's things service."""
    return s["things"].base_url + path


def things(fault: Any = None) -> Services:
    return Services([Things()], fault=fault)


def make(s: Services, status: int, key: str | None = "k", **params: Any) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return send(s, "POST", url(s), headers, json={"status": status, **params})


# -- the attempt record ---------------------------------------------------------------------


def test_an_attempt_records_every_header_twice_reads_and_what_the_client_saw() -> None:
    s = payments()
    before = time.time()
    r = refund(
        s,
        "k-1",
        **{SOURCE_HEADER: "model", CALL_HEADER: "7", BACKOFF_HEADER: "1.5"},
    )
    after = time.time()
    assert r.status_code == 200
    (attempt,) = s.ledger.attempts
    assert attempt.at is not None and before <= attempt.at <= after
    assert record(attempt) == {
        "n": 1,
        "service": "payments",
        "method": "POST",
        "path": "/v1/refunds",
        "route": "payments.refund.create",
        "mutating": True,
        "key": "k-1",
        "params": BODY,
        "source": "model",
        "call": 7,
        "status": 200,
        "delivered": True,
        "outcome": "ok",
        "fault": None,
        "replayed": False,
        "effect_ids": ["re_1"],
        "backoff": 1.5,
        "asked": None,
        "reply": None,
    }


def test_an_attempt_without_twices_headers_has_their_defaults() -> None:
    s = payments()
    refund(s)
    (attempt,) = s.ledger.attempts
    assert (attempt.source, attempt.call, attempt.backoff, attempt.key) == (
        "unknown", None, 0.0, None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("call", "backoff", "expected"),
    [
        ("12", "0.25", (12, 0.25)),
        ("0", "0", (0, 0.0)),
        ("x7", "", (None, 0.0)),  # not a number: no call; an empty backoff is none
        ("", "3", (None, 3.0)),
    ],
)
def test_an_attempt_reads_the_call_number_and_backoff_as_sent(
    call: str, backoff: str, expected: tuple[int | None, float]
) -> None:
    s = payments()
    refund(s, **{CALL_HEADER: call, BACKOFF_HEADER: backoff})
    (attempt,) = s.ledger.attempts
    assert (attempt.call, attempt.backoff) == expected


def test_an_attempt_holds_the_query_body_and_path_parameters() -> None:
    s = payments()
    refund(s)
    send(s, "GET", "https://payments.twice.test/v1/orders/order_1042", params={"expand": "x"})
    send(s, "GET", REFUNDS, params={"order_id": "order_1042"})
    create, order, listing = s.ledger.attempts
    assert [a.n for a in s.ledger.attempts] == [1, 2, 3]
    assert create.params == BODY
    assert (order.route, order.mutating, order.params) == (
        "payments.order.get", False, {"expand": "x", "order_id": "order_1042"},
    )  # fmt: skip
    assert (order.method, order.path) == ("GET", "/v1/orders/order_1042")
    assert (listing.route, listing.params, listing.effect_ids) == (
        "payments.refund.list", {"order_id": "order_1042"}, [],
    )  # fmt: skip


def test_attempts_are_numbered_over_every_service_of_the_trial() -> None:
    s = Services([PaymentsService(orders=ORDERS), Things()])
    refund(s)
    make(s, 200, key=None)
    send(s, "GET", "https://payments.twice.test/v9/none")
    refund(s)
    assert [(a.n, a.service) for a in s.ledger.attempts] == [
        (1, "payments"), (2, "things"), (3, "unknown"), (4, "payments"),
    ]  # fmt: skip
    assert [(e.id, e.attempt) for e in s.ledger.effects] == [("re_1", 1), ("th_1", 2), ("re_2", 4)]


def test_a_request_no_route_matches_is_a_404_attempt_of_no_service() -> None:
    s = payments()
    r = send(
        s,
        "POST",
        "https://payments.twice.test/v2/refunds",
        {"Idempotency-Key": "k", SOURCE_HEADER: "transport", CALL_HEADER: "2"},
        json=BODY,
    )
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "type": "not_found",
            "message": "the payments API has no endpoint POST /v2/refunds",
        }
    }
    (attempt,) = s.ledger.attempts
    assert record(attempt) == {
        "n": 1,
        "service": "unknown",
        "method": "POST",
        "path": "/v2/refunds",
        "route": None,
        "mutating": False,
        "key": "k",
        "params": {},
        "source": "transport",
        "call": 2,
        "status": 404,
        "delivered": True,
        "outcome": "fail",
        "fault": None,
        "replayed": False,
        "effect_ids": [],
        "backoff": 0.0,
        "asked": None,
        "reply": None,
    }
    assert attempt.at is not None
    assert len(s["payments"].keys) == 0  # a key on no route reserves nothing


def test_a_request_no_route_matches_leaves_the_fault_for_a_real_call() -> None:
    # A 404 did no work and is no mutating call: the scheduled lost reply waits for one.
    s = payments(LostReply())
    assert send(s, "POST", "https://payments.twice.test/v2/refunds", json=BODY).status_code == 404
    with pytest.raises(httpx.ReadTimeout):
        refund(s)
    assert [a.fault for a in s.ledger.attempts] == [None, "lost_reply"]


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("https://payments.twice.test", "the payments API has no endpoint GET /"),
        ("https://payments.twice.test/", "the payments API has no endpoint GET /"),
        ("https://payments.twice.test?x=1", "the payments API has no endpoint GET ?x=1"),
        ("https://payments.twice.test/v1?x=1", "the payments API has no endpoint GET /v1?x=1"),
        # A host that merely begins with the service's is another host: the whole URL.
        (
            "https://payments.twice.test.example/v1/refunds",
            "no such endpoint: GET https://payments.twice.test.example/v1/refunds",
        ),
        (
            "https://payments.twice.testx/v1/refunds",
            "no such endpoint: GET https://payments.twice.testx/v1/refunds",
        ),
    ],
)
def test_a_404_names_the_service_and_path_on_its_host_else_the_whole_url(
    url: str, said: str
) -> None:
    s = Services([Things(), PaymentsService(orders=ORDERS)])
    r = send(s, "GET", url)
    assert (r.status_code, r.json()["error"]["message"]) == (404, said)


# -- the fault's schedule ---------------------------------------------------------------------


def test_a_schedule_on_a_route_counts_that_routes_mutating_attempts_only() -> None:
    # Two services, each mutating: the second refund is hit, not the second mutating call.
    route = "payments.refund.create"
    s = Services(
        [PaymentsService(orders=ORDERS), Things()],
        fault=LostReply(schedule=Schedule(attempts=(2,), route=route)),
    )
    make(s, 200, key=None)
    refund(s)
    make(s, 200, key=None)
    send(s, "GET", REFUNDS)
    with pytest.raises(httpx.ReadTimeout):
        refund(s)
    refund(s)
    assert [(a.route, a.fault) for a in s.ledger.attempts] == [
        ("things.thing.create", None),
        (route, None),
        ("things.thing.create", None),
        ("payments.refund.list", None),
        (route, "lost_reply"),
        (route, None),
    ]


def test_a_schedule_counts_mutating_attempts_over_every_service() -> None:
    s = Services(
        [PaymentsService(orders=ORDERS), Things()],
        fault=LostReply(schedule=Schedule(attempts=(3,))),
    )
    send(s, "GET", REFUNDS)
    make(s, 200, key=None)
    refund(s)
    send(s, "GET", REFUNDS)
    with pytest.raises(httpx.ReadTimeout):
        make(s, 200, key=None)
    assert [a.fault for a in s.ledger.attempts] == [None, None, None, None, "lost_reply"]


@pytest.mark.parametrize("name", ["lost_reply", "timeout_before_commit", "rate_limited"])
@pytest.mark.parametrize("bad_key", ["", "k" * 256])
def test_a_fault_passes_over_a_request_refused_for_its_key(name: str, bad_key: str) -> None:
    # The key is checked before either of the fault's hooks: a fault before the work never
    # ran either, and was lost, so the agent's real call ran fault-free (scored safe).
    s = payments(get_fault(name))
    assert refund(s, bad_key).status_code == 400
    with contextlib.suppress(httpx.ReadTimeout):
        assert refund(s, "k2").status_code == 429
    assert [a.fault for a in s.ledger.attempts] == [None, name]
    assert refund(s).status_code == 200  # and it hits once
    assert [a.fault for a in s.ledger.attempts][2] is None
    assert len(s.ledger.effects) == (2 if get_fault(name).commits else 1)


def test_a_fault_before_the_work_keeps_an_attempt_it_reached() -> None:
    # Its hook ran and let the request through; the request was then refused (a body that
    # is not parameters): nothing is done either way, so the hit is not passed on.
    @dataclasses.dataclass(frozen=True)
    class Watching(Fault):
        name: str = "watching"
        commits: bool = False

    s = payments(Watching())
    bad = send(s, "POST", REFUNDS, {"content-type": "application/json"}, content=b"[1]")
    assert bad.status_code == 400
    assert refund(s).status_code == 200
    assert [a.fault for a in s.ledger.attempts] == [None, None]


def test_a_commit_fault_passes_over_a_keyed_request_with_other_parameters() -> None:
    s = payments(LostReply(schedule=Schedule(attempts=(2,))))
    assert refund(s, "k").status_code == 200
    conflict = refund(s, "k", body={"order_id": "order_1042", "amount": 1})
    assert conflict.status_code == 422
    with pytest.raises(httpx.ReadTimeout):
        refund(s, "k3")
    assert [a.fault for a in s.ledger.attempts] == [None, None, "lost_reply"]


def test_two_deferred_hits_pass_to_the_next_two_mutating_attempts() -> None:
    s = payments(LostReply(schedule=Schedule(attempts=(1, 2))))
    too_much = {"order_id": "order_1042", "amount": 100_000}
    assert refund(s, body=too_much).status_code == 400
    assert refund(s, body=too_much).status_code == 400
    for _ in range(2):
        with pytest.raises(httpx.ReadTimeout):
            refund(s)
    assert refund(s).status_code == 200
    assert [a.fault for a in s.ledger.attempts] == [None, None, "lost_reply", "lost_reply", None]


def test_a_fault_on_every_attempt_defers_nothing() -> None:
    # Every matching attempt is hit anyway: a refused one must not add a hit to the next.
    s = payments(LostReply(schedule=Schedule(every=True)))
    assert refund(s, body={"order_id": "order_1042", "amount": 100_000}).status_code == 400
    with pytest.raises(httpx.ReadTimeout):
        refund(s)
    assert [a.fault for a in s.ledger.attempts] == [None, "lost_reply"]


def test_a_commit_fault_hits_a_handlers_own_5xx_and_passes_over_its_4xx() -> None:
    # A 4xx is a refusal before any work began; a 5xx may come after the work.
    s = things(LostReply())
    assert make(s, 499, key=None).status_code == 499
    with pytest.raises(httpx.ReadTimeout):
        make(s, 500, key=None, commit=True)
    assert make(s, 200, key=None).status_code == 200
    assert [a.fault for a in s.ledger.attempts] == [None, "lost_reply", None]
    assert [a.status for a in s.ledger.attempts] == [499, 500, 200]


# -- keys around the commit -----------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 404, 499])
def test_a_handlers_4xx_frees_its_key(status: int) -> None:
    s = things()
    assert make(s, status).status_code == status
    assert len(s["things"].keys) == 0
    again = make(s, 200)
    assert again.status_code == 200 and not s.ledger.attempts[1].replayed


@pytest.mark.parametrize("status", [201, 399, 500, 503])
def test_a_handlers_other_answers_are_saved_and_replayed(status: int) -> None:
    s = things()
    first = make(s, status, commit=True)
    again = make(s, status, commit=True)
    assert (first.status_code, again.status_code) == (status, status)
    assert again.json() == first.json() == {"id": "th_1", "status": status}
    assert again.headers[REPLAYED_HEADER] == "true" and s.ledger.attempts[1].replayed
    assert [e.id for e in s.ledger.effects] == ["th_1"]


def test_a_reply_with_no_body_is_saved_and_replayed_with_none() -> None:
    s = things()
    first, again = make(s, 204), make(s, 204)
    assert (first.status_code, first.content) == (204, b"")
    assert (again.status_code, again.content) == (204, b"")
    assert again.headers[REPLAYED_HEADER] == "true"
    assert len(s.ledger.effects) == 1


def test_a_key_on_a_method_the_service_does_not_key_is_ignored() -> None:
    # Stripe: a key on DELETE does nothing; each delete does its work.
    s = things()
    for _ in range(2):
        r = send(s, "DELETE", url(s, "/v1/things/th_9"), {"Idempotency-Key": "k"})
        assert r.status_code == 204 and REPLAYED_HEADER not in r.headers
    assert [e.id for e in s.ledger.effects] == ["del_1", "del_2"]
    assert len(s["things"].keys) == 0
    assert [a.key for a in s.ledger.attempts] == ["k", "k"]  # recorded all the same


def test_a_service_that_keys_other_methods_honours_the_key_on_them() -> None:
    class KeyedDeletes(Things):
        keyed_methods: ClassVar[frozenset[str]] = frozenset({"POST", "DELETE"})

    s = Services([KeyedDeletes()])
    for _ in range(2):
        assert (
            send(s, "DELETE", url(s, "/v1/things/th_9"), {"Idempotency-Key": "k"}).status_code
            == 204
        )
    assert [e.id for e in s.ledger.effects] == ["del_1"]
    assert [a.replayed for a in s.ledger.attempts] == [False, True]


def test_a_service_without_keys_ignores_the_header_on_its_mutating_route() -> None:
    s = Services([EmailService()])
    message = {"to": "dana@example.com", "subject": "Refund", "body": "Done."}
    for _ in range(2):
        r = send(s, "POST", "https://email.twice.test/v1/messages", {"Idempotency-Key": "k"},
                 json=message)  # fmt: skip
        assert r.status_code == 200
    assert [e.id for e in s.ledger.effects] == ["msg_1", "msg_2"]
    assert [a.key for a in s.ledger.attempts] == ["k", "k"]


def test_a_service_reads_its_key_from_its_own_header() -> None:
    class OwnHeader(Things):
        key_header: ClassVar[str] = "X-Request-Key"

    s = Services([OwnHeader()])
    for _ in range(2):
        send(s, "POST", url(s), {"X-Request-Key": "k", "Idempotency-Key": "other"}, json={})
    assert [a.key for a in s.ledger.attempts] == ["k", "k"]
    assert [a.replayed for a in s.ledger.attempts] == [False, True]
    assert len(s.ledger.effects) == 1


def test_a_key_reused_on_another_endpoint_is_a_conflict() -> None:
    # The same parameters to another path, or with another method on the same path, are
    # another request: the key's first answer is not theirs to replay.
    class KeyedPuts(Things):
        keyed_methods: ClassVar[frozenset[str]] = frozenset({"POST", "PUT"})

    s = Services([KeyedPuts()])
    body = {"status": 200}
    assert send(s, "POST", url(s), {"Idempotency-Key": "k"}, json=body).status_code == 200
    other_path = send(s, "POST", url(s, "/v1/widgets"), {"Idempotency-Key": "k"}, json=body)
    other_method = send(s, "PUT", url(s), {"Idempotency-Key": "k"}, json=body)
    assert (other_path.status_code, other_method.status_code) == (422, 422)
    assert [e.id for e in s.ledger.effects] == ["th_1"]


class OwnErrors(Things):
    """A service whose errors are not in Stripe's shape."""

    def error_response(
        self, status: int, message: str, type: str = "invalid_request_error"
    ) -> httpx.Response:
        return httpx.Response(status, json={"problem": {"kind": type, "detail": message}})


def test_the_pipelines_refusals_are_in_the_services_own_error_shape() -> None:
    s = Services([OwnErrors()])
    malformed = send(s, "POST", url(s), {"Idempotency-Key": ""}, json={})
    assert malformed.status_code == 400
    assert malformed.json() == {
        "problem": {
            "kind": "invalid_request_error",
            "detail": "Idempotency-Key is empty; give a unique key per operation",
        }
    }
    bad_body = send(s, "POST", url(s), {"content-type": "application/json"}, content=b"[1]")
    assert bad_body.status_code == 400
    assert bad_body.json() == {
        "problem": {
            "kind": "invalid_request_error",
            "detail": "the request body must be a JSON object of parameters, not list",
        }
    }
    make(s, 200, key="k")
    conflict = make(s, 201, key="k")
    assert conflict.status_code == 422 and conflict.json()["problem"]["kind"] == "idempotency_error"
    assert [(a.status, a.outcome) for a in s.ledger.attempts] == [
        (400, "fail"), (400, "fail"), (200, "ok"), (422, "fail"),
    ]  # fmt: skip


def test_a_keyed_request_with_a_bad_body_frees_its_key() -> None:
    s = payments()
    r = send(
        s,
        "POST",
        REFUNDS,
        {"Idempotency-Key": "k", "content-type": "application/json"},
        content=b"{not json",
    )
    assert r.status_code == 400 and len(s["payments"].keys) == 0
    again = refund(s, "k")
    assert again.status_code == 200 and not s.ledger.attempts[1].replayed


def test_a_keyed_replay_with_an_unreadable_body_replays_the_saved_answer() -> None:
    # The parameters that make the fingerprint came from the query: the same request, whose
    # answer was saved; the body it cannot read changes nothing it already did.
    s = payments()
    params = {"order_id": "order_1042", "amount": "499"}
    first = send(s, "POST", REFUNDS, {"Idempotency-Key": "k"}, params=params)
    again = send(
        s,
        "POST",
        REFUNDS,
        {"Idempotency-Key": "k", "content-type": "application/json"},
        params=params,
        content=b"[1]",
    )
    assert first.status_code == 200
    assert again.status_code == 200 and again.json() == first.json()
    assert s.ledger.attempts[1].replayed and len(s.ledger.effects) == 1


@pytest.mark.parametrize("fault", [ErrorBeforeCommit, TimeoutBeforeCommit])
def test_a_fault_before_a_replay_keeps_the_saved_answer(fault: type[Fault]) -> None:
    # The keyed retry met a refusal (or a timeout) before it reached the store's answer:
    # the work was done once, and the next retry still replays it, never doing it again.
    s = payments(fault(schedule=Schedule(attempts=(2,))))
    first = refund(s, "k")
    with contextlib.suppress(httpx.ReadTimeout):
        assert refund(s, "k").status_code == 503
    again = refund(s, "k")
    assert again.status_code == 200 and again.json() == first.json()
    assert [a.replayed for a in s.ledger.attempts] == [False, False, True]
    assert [a.fault for a in s.ledger.attempts] == [None, fault().name, None]
    assert [e.id for e in s.ledger.effects] == ["re_1"]


def test_a_server_error_is_saved_with_its_own_status() -> None:
    s = payments(ServerErrorAfterCommit(status=503))
    first, again = refund(s, "k"), refund(s, "k")
    assert (first.status_code, again.status_code) == (503, 503)
    assert again.json() == first.json() and s.ledger.attempts[1].replayed


def test_a_server_error_on_a_replay_leaves_the_saved_answer() -> None:
    # The fault hit the keyed retry, which did no work: the first answer stays saved.
    s = payments(ServerErrorAfterCommit(schedule=Schedule(attempts=(2,))))
    first = refund(s, "k")
    assert refund(s, "k").status_code == 500
    third = refund(s, "k")
    assert third.status_code == 200 and third.json() == first.json()
    assert len(s.ledger.effects) == 1


def test_a_handler_that_raises_after_committing_saves_the_failure_body() -> None:
    class Failing(Things):
        def create(self, call: Call) -> httpx.Response:
            call.commit("things.thing.create", "th", {})
            raise RuntimeError("handler bug")

    s = Services([Failing()])
    with pytest.raises(RuntimeError, match="handler bug"):
        make(s, 200)
    again = make(s, 200)
    assert again.status_code == 500 and again.json() == {
        "error": {"type": "api_error", "message": "The service failed while handling the request"}
    }
    failed = s.ledger.attempts[0]
    assert (failed.status, failed.delivered, failed.outcome) == (None, False, "unknown")


# -- what the client saw, per fault ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "status", "delivered", "outcome", "effects"),
    [
        ("lost_reply", 200, False, "unknown", 1),
        ("reset_after_commit", 200, False, "unknown", 1),
        ("timeout_before_commit", None, False, "unknown", 0),
        ("error_after_commit", 502, True, "unknown", 1),
        ("server_error_after_commit", 500, True, "unknown", 1),
        ("error_before_commit", 503, True, "unknown", 0),
        ("rate_limited", 429, True, "fail", 0),
        ("crash_after_commit", 200, True, "ok", 1),
    ],
)
def test_a_faulted_attempt_records_the_status_made_and_whether_it_was_delivered(
    name: str, status: int | None, delivered: bool, outcome: str, effects: int
) -> None:
    s = payments(get_fault(name))
    with contextlib.suppress(httpx.TransportError):
        refund(s)
    (attempt,) = s.ledger.attempts
    assert (attempt.status, attempt.delivered, attempt.outcome, attempt.fault) == (
        status, delivered, outcome, name,
    )  # fmt: skip
    assert len(attempt.effect_ids) == len(s.ledger.effects) == effects


# -- the set, its router and its transport --------------------------------------------------


def test_two_services_of_one_name_are_refused() -> None:
    with pytest.raises(ValueError) as raised:
        Services([PaymentsService(), PaymentsService(base_url="https://other.twice.test")])
    assert str(raised.value) == "two services named 'payments' in one Services set"


def test_a_set_knows_its_effect_names_and_gives_its_services_its_ledger() -> None:
    s = Services([PaymentsService(orders=ORDERS), TicketsService()])
    assert s.ledger.known_effects == {
        "payments.order.get",
        "payments.refund.create",
        "payments.refund.list",
        "payments.refund.get",
        "tickets.customer.get",
        "tickets.ticket.create",
        "tickets.ticket.list",
        "tickets.ticket.get",
    }
    assert s["payments"].ledger is s["tickets"].ledger is s.ledger
    assert isinstance(s.fault, get_fault("none").__class__)


def test_trials_of_one_layout_share_one_router_per_kind_of_client() -> None:
    a, b = payments(), payments(LostReply())
    other = Services([PaymentsService(orders=ORDERS, base_url="https://pay.twice.test")])
    assert a.router is b.router and a.sync_router is b.sync_router
    assert a.sync_router is a.sync_router and a.router is not a.sync_router
    assert other.router is not a.router and other.sync_router is not a.sync_router
    # Shared, the routers keep no record of the calls they served: the ledger is the record.
    refund(a)
    with a.sync_client() as client:
        client.post(REFUNDS, json=BODY)
    assert a.router.calls.call_count == a.sync_router.calls.call_count == 0
    assert all(route.calls.call_count == 0 for route in a.router.routes)


def test_sets_whose_services_differ_only_in_name_share_a_router_and_keep_their_own() -> None:
    class Payments2(PaymentsService):
        name: ClassVar[str] = "payments2"

    a, b = payments(), Services([Payments2(orders=ORDERS)])
    assert a.router is b.router
    refund(a)
    refund(b)
    refund(b)
    assert [(x.n, x.service) for x in a.ledger.attempts] == [(1, "payments")]
    assert [(x.n, x.service) for x in b.ledger.attempts] == [(1, "payments2"), (2, "payments2")]
    assert [e.id for e in b.ledger.effects] == ["re_1", "re_2"]


def test_a_routers_routes_are_named_for_the_effects_they_commit() -> None:
    # The names a respx user reads (a route's repr, router[name]) are the effect names.
    s = Services([PaymentsService(orders=ORDERS), Things()])
    for router in (s.router, s.sync_router):
        assert [r.name for r in router.routes] == [
            "payments.order.get",
            "payments.refund.create",
            "payments.refund.list",
            "payments.refund.get",
            "things.thing.create",
            "things.thing.delete",
            "things.thing.list",
            "things.thing.replace",
            "things.widget.create",
            "unmatched",
        ]
        assert router.routes["payments.refund.create"].pattern is not None


def test_a_routes_side_effect_carries_its_signature_ready_made() -> None:
    # respx reads a side effect's signature on every call; computed from source each time,
    # that was a tenth of an attempt's cost.
    s = things()
    for router in (s.router, s.sync_router):
        routes = [r for r in router.routes if r.name != "unmatched"]
        signatures = [inspect.signature(r.side_effect) for r in routes]
        assert all(sig is signatures[0] for sig in signatures)
        assert list(signatures[0].parameters) == ["request", "path_params"]


def test_the_router_cache_is_bounded() -> None:
    from twice.mocks import _trial_services as trial

    tag = uuid.uuid4().hex[:12]  # layouts no earlier test of the process built
    routers, sizes = [], []
    for n in range(trial.MAX_ROUTERS + 1):
        routers.append(Services([Things(base_url=f"https://{tag}-{n}.twice.test")]).router)
        sizes.append(len(trial._ROUTERS))
    assert min(sizes) > 0 and max(sizes) == trial.MAX_ROUTERS
    # The newest layout's router was kept after the cache was emptied: it is reused.
    last = Services([Things(base_url=f"https://{tag}-{trial.MAX_ROUTERS}.twice.test")])
    assert last.router is routers[-1]


def test_a_shared_router_called_outside_a_transport_says_what_to_use() -> None:
    # Raised as _bound raises it (from None), from a route's side effect, blocking or async,
    # and from the catch-all: no respx wrapper in its chain, which a traceback printer
    # without a seen-set would walk for ever.
    s = things()
    message = (
        "a shared services router was called outside a Services transport; "
        "use Services.client() / sync_client() / dispatch()"
    )
    request = httpx.Request("POST", url(s), json={})
    nowhere = httpx.Request("GET", "https://nowhere.twice.test/")
    calls = [
        lambda: s.sync_router.handler(request),
        lambda: asyncio.run(s.router.async_handler(request)),
        lambda: s.sync_router.handler(nowhere),
        lambda: asyncio.run(s.router.async_handler(nowhere)),
    ]
    for call in calls:
        with pytest.raises(RuntimeError) as raised:
            call()
        error = raised.value
        assert str(error) == message
        assert error.__cause__ is None and error.__suppress_context__
        assert isinstance(error.__context__, LookupError)
        assert error.__context__.__cause__ is None and error.__context__.__context__ is None
    assert s.ledger.attempts == []


def test_a_handlers_error_keeps_its_chain_blocking_or_async() -> None:
    class Failing(Things):
        def create(self, call: Call) -> httpx.Response:
            try:
                {}["thing"]
            except KeyError as missing:
                raise ValueError("handler bug") from missing
            raise AssertionError("unreachable")

    s = Services([Failing()])
    blocking = lambda: s.dispatch(httpx.Request("POST", url(s), json={}))  # noqa: E731
    for call in (blocking, lambda: make(s, 200)):
        with pytest.raises(ValueError, match=r"^handler bug$") as raised:
            call()
        error = raised.value
        assert isinstance(error.__cause__, KeyError) and error.__context__ is error.__cause__
        assert error.__suppress_context__
        assert error.__cause__.__cause__ is None and error.__cause__.__context__ is None
    assert [(a.n, a.outcome, a.delivered) for a in s.ledger.attempts] == [
        (1, "unknown", False), (2, "unknown", False),
    ]  # fmt: skip


def test_dispatch_serves_a_request_as_a_respx_side_effect_would() -> None:
    s = things()
    headers = {SOURCE_HEADER: "user", "Idempotency-Key": "k"}
    first = s.dispatch(httpx.Request("POST", url(s), json={"status": 201}, headers=headers))
    again = s.dispatch(httpx.Request("POST", url(s), json={"status": 201}, headers=headers))
    assert (first.status_code, first.json()) == (201, {"id": "th_1", "status": 201})
    assert again.json() == first.json() and again.headers[REPLAYED_HEADER] == "true"
    missing = s.dispatch(httpx.Request("GET", url(s, "/v0")))
    assert missing.status_code == 404
    assert [(a.source, a.status, a.replayed) for a in s.ledger.attempts] == [
        ("user", 201, False), ("user", 201, True), ("unknown", 404, False),
    ]  # fmt: skip


def test_a_request_is_in_flight_for_one_pass_of_the_event_loop() -> None:
    # Timeouts are raised, never slept: the in-flight window lets other tasks in once and
    # costs no wall time, however many requests a trial sends.
    s = things()

    async def go() -> int:
        async with s.client() as client:
            task = asyncio.ensure_future(client.post(url(s), json={}))
            for passes in range(1, 20):
                await asyncio.sleep(0)
                if task.done():
                    assert task.result().status_code == 200
                    return passes
            task.cancel()
            return -1

    assert 0 < asyncio.run(go()) <= 3


def test_concurrent_requests_with_one_key_on_a_fresh_router_are_200_and_409() -> None:
    s = things()

    async def both() -> list[int]:
        async with s.client() as client:
            sent = [client.post(url(s), json={}, headers={"Idempotency-Key": "k"}) for _ in "ab"]
            return sorted(r.status_code for r in await asyncio.gather(*sent))

    assert asyncio.run(both()) == [200, 409]
    assert len(s.ledger.effects) == 1


def test_a_sync_client_and_an_async_one_serve_the_same_trial() -> None:
    s = things(LostReply(schedule=Schedule(attempts=(2, 3))))
    with s.sync_client() as client:
        assert client.post(url(s), json={}).status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            client.post(url(s), json={})
        assert client.get(url(s, "/nothing")).status_code == 404
    with pytest.raises(httpx.ReadTimeout):
        make(s, 200, key=None)
    assert [a.fault for a in s.ledger.attempts] == [None, "lost_reply", None, "lost_reply"]
    assert [a.outcome for a in s.ledger.attempts] == ["ok", "unknown", "fail", "unknown"]
    assert [e.id for e in s.ledger.effects] == ["th_1", "th_2", "th_3"]


def test_the_clients_take_httpx_client_arguments() -> None:
    s = things()
    base, headers = s["things"].base_url, {SOURCE_HEADER: "framework"}

    async def go() -> httpx.Response:
        async with s.client(base_url=base, headers=headers) as client:
            return await client.post("/v1/things", json={})

    assert asyncio.run(go()).status_code == 200
    with s.sync_client(base_url=base, headers=headers) as client:
        assert client.post("/v1/things", json={}).status_code == 200
    assert [a.source for a in s.ledger.attempts] == ["framework", "framework"]


@dataclasses.dataclass(frozen=True)
class Seeing(Fault):
    """A fault that lets everything through and notes the requests its hooks were given."""

    name: str = "seeing"
    seen: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)

    def before_commit(self, request: httpx.Request) -> httpx.Response | None:
        self.seen.append(("before", request.method, str(request.url)))
        return None

    def after_commit(self, request: httpx.Request, response: httpx.Response) -> httpx.Response:
        self.seen.append(("after", request.method, str(request.url)))
        return response


def test_a_faults_hooks_see_the_request_that_was_sent() -> None:
    # A fault of one's own may choose by what was asked (only refunds over $10, say).
    fault = Seeing()
    s = things(fault)
    assert make(s, 200, key=None).status_code == 200
    assert fault.seen == [("before", "POST", url(s)), ("after", "POST", url(s))]
    assert s.ledger.attempts[0].fault == "seeing"
