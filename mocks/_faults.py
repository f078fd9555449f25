"""Faults as data: what a service does wrong, placed before or after its commit point.

A fault is a frozen dataclass with two hooks around the commit point:

* ``before_commit(request)`` runs after the attempt is recorded and before any work. It may
  return a response (the work is then not done) or raise a timeout.
* ``after_commit(request, response)`` runs after the work was committed. It may replace the
  response or raise a transport error (the work stays done: the reply is lost).

Which attempts a fault hits is its :class:`Schedule`; by default the first mutating attempt of
the trial. Timeouts are raised at once, never slept, so a faulty trial costs no wall time.

Write your own by subclassing :class:`Fault` (or any frozen dataclass with ``name``,
``schedule`` and the two hooks).

``crash_after_commit`` is the one fault that hits the client rather than the wire: the service
commits and replies, and the reply carries :data:`CRASH_HEADER`, which tells twice's tool layer
that the agent run died right after the commit. The run is then restarted from the
conversation as it stood before the call (a *resume* retry; see ``tasks.resumable_generate``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import httpx

from ._ledger import Attempt

CRASH_HEADER = "X-Twice-Crash"
"""Response header set by :class:`CrashAfterCommit`: the client must act as if its run died
right after receiving this reply (twice's tool layer raises ``tasks.RunCrashed``)."""


@dataclass(frozen=True)
class Schedule:
    """Which mutating attempts of a trial a fault hits.

    Attributes:
        attempts: 1-based numbers of the trial's mutating attempts to hit (counted over every
            service of the trial). ``()`` with ``every=True`` hits all of them.
        route: Only count attempts on this route (``payments.refund.create``); None counts all.
        every: Hit every matching attempt.
    """

    attempts: tuple[int, ...] = (1,)
    route: str | None = None
    every: bool = False

    def matches(self, attempt: Attempt) -> bool:
        """Whether ``attempt`` is one this schedule counts (mutating, on its route)."""
        return attempt.mutating and (self.route is None or attempt.route == self.route)

    def hits(self, attempt: Attempt, nth: int) -> bool:
        """Whether the ``nth`` matching mutating attempt should be hit."""
        return self.matches(attempt) and (self.every or nth in self.attempts)


@dataclass(frozen=True)
class Fault:
    """No fault: the base class; both hooks pass the attempt through."""

    name: str = "none"
    schedule: Schedule = field(default_factory=Schedule)
    commits: bool = True
    """Whether the work is done when this fault hits (documentation and the report)."""
    saved: bool = False
    """Whether a response :meth:`after_commit` returns is the service's own answer, saved
    under the request's idempotency key and replayed to keyed retries (a service-side error,
    as Stripe saves its 500s). False: it comes from something between client and service (a
    gateway), and the service's own saved response is what a keyed retry gets."""
    conversation: str | None = None
    """The conversation faults that come with this one (:data:`CONVERSATION_FAULTS`), joined
    by ``+`` in the order they happen (``compaction+ask_again``): what twice's agent loop does
    to the conversation (the user asks again, the context is compacted). None: the
    conversation is left alone."""

    def changes(self, conversation: str) -> bool:
        """Whether this fault carries the conversation fault ``conversation``."""
        return self.conversation is not None and conversation in self.conversation.split("+")

    @property
    def wire_name(self) -> str:
        """The wire fault's own name: ``lost_reply`` of ``lost_reply+ask_again``, ``none`` of
        ``ask_again``; what an attempt it hits records."""
        if self.conversation is None:
            return self.name
        wire = self.name.removesuffix(self.conversation).removesuffix("+")
        return wire or "none"

    def before_commit(self, request: httpx.Request) -> httpx.Response | None:
        """Return a response to stop before the work, or raise; None lets the work happen."""
        return None

    def after_commit(self, request: httpx.Request, response: httpx.Response) -> httpx.Response:
        """Return the response the client gets, or raise to lose it."""
        return response


def _timeout(request: httpx.Request) -> httpx.ReadTimeout:
    return httpx.ReadTimeout("timed out waiting for the response", request=request)


def _reset(request: httpx.Request) -> httpx.RemoteProtocolError:
    # What httpx raises when a real server closes the connection after reading the request
    # and before answering: tools see the same class in process as over a socket.
    return httpx.RemoteProtocolError(
        "Server disconnected without sending a response.", request=request
    )


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"type": "api_error", "message": message}}, headers=headers
    )


@dataclass(frozen=True)
class NoFault(Fault):
    """Every attempt gets its reply."""


@dataclass(frozen=True)
class LostReply(Fault):
    """The work is committed, then the reply is lost: the client sees a read timeout."""

    name: str = "lost_reply"

    def after_commit(self, request: httpx.Request, response: httpx.Response) -> httpx.Response:
        raise _timeout(request)


@dataclass(frozen=True)
class ResetAfterCommit(Fault):
    """The work is committed, then the connection closes with no reply: a connection error.

    Not a timeout: the client fails at once (httpx ``RemoteProtocolError``, requests
    ``ConnectionError``, Node's fetch ``UND_ERR_SOCKET``), as when a gateway or the service's
    process dies after the commit. The outcome is as unknown as after ``lost_reply``; a client
    that retries only connection errors (taking them for "never sent") duplicates here.
    """

    name: str = "reset_after_commit"

    def after_commit(self, request: httpx.Request, response: httpx.Response) -> httpx.Response:
        raise _reset(request)


@dataclass(frozen=True)
class TimeoutBeforeCommit(Fault):
    """The request times out before any work: same timeout as ``lost_reply``, nothing done."""

    name: str = "timeout_before_commit"
    commits: bool = False

    def before_commit(self, request: httpx.Request) -> httpx.Response | None:
        raise _timeout(request)


@dataclass(frozen=True)
class ErrorAfterCommit(Fault):
    """The work is committed, then a gateway answers 502: outcome unknown to the client.

    The service itself finished and saved its 200 under the idempotency key; only the gateway
    failed. A keyed retry therefore gets the saved 200 (the effect the first attempt made),
    never the 502.
    """

    name: str = "error_after_commit"
    status: int = 502

    def after_commit(self, request: httpx.Request, response: httpx.Response) -> httpx.Response:
        return _error(self.status, "Bad gateway: the upstream connection was reset")


@dataclass(frozen=True)
class ServerErrorAfterCommit(Fault):
    """The work is committed, then the service itself answers 500 and saves that answer.

    Stripe's rule: a request that began executing has its result saved under its key, 500s
    included, so every keyed retry replays the 500 and the client never learns the effect
    exists; only a lookup (or a fresh key, which makes a second effect) gets past it.
    """

    name: str = "server_error_after_commit"
    status: int = 500
    saved: bool = True

    def after_commit(self, request: httpx.Request, response: httpx.Response) -> httpx.Response:
        return _error(self.status, "Internal server error while finishing the request")


@dataclass(frozen=True)
class ErrorBeforeCommit(Fault):
    """The service answers 503 before doing any work."""

    name: str = "error_before_commit"
    status: int = 503
    commits: bool = False

    def before_commit(self, request: httpx.Request) -> httpx.Response | None:
        return _error(self.status, "Service unavailable, try again later")


@dataclass(frozen=True)
class RateLimited(Fault):
    """The service refuses the attempt with 429 and a Retry-After header; no work is done."""

    name: str = "rate_limited"
    retry_after: float = 2.0
    commits: bool = False

    def before_commit(self, request: httpx.Request) -> httpx.Response | None:
        return _error(
            429,
            "Too many requests",
            headers={"Retry-After": f"{self.retry_after:g}"},
        )


@dataclass(frozen=True)
class CrashAfterCommit(Fault):
    """The work is committed, then the agent run dies and restarts from its last checkpoint.

    The service replies normally but marks the reply with :data:`CRASH_HEADER`; the client's
    run dies before the reply reaches the conversation, and a restarted run re-executes the
    step from the conversation as it stood before the call (the seeds' third retry source,
    ``resume``). Whatever the client recorded durably before dying (an action log) survives.
    """

    name: str = "crash_after_commit"

    def after_commit(self, request: httpx.Request, response: httpx.Response) -> httpx.Response:
        return httpx.Response(
            response.status_code,
            content=response.content,
            headers={"Content-Type": "application/json", CRASH_HEADER: "after_commit"},
        )


FAULTS: dict[str, Fault] = {
    f.name: f
    for f in (
        NoFault(),
        LostReply(),
        ResetAfterCommit(),
        TimeoutBeforeCommit(),
        ErrorAfterCommit(),
        ErrorBeforeCommit(),
        RateLimited(),
        CrashAfterCommit(),
        ServerErrorAfterCommit(),
    )
}
"""The built-in faults by CLI name, each with the default schedule."""


CONVERSATION_FAULTS: dict[str, str] = {
    "ask_again": "after the final answer the user asks if it went through (retry source user)",
    "compaction": "tool results compacted away after the first mutating result (source compaction)",
}
"""Duplicates that come from the conversation, not the network: nothing goes wrong on the
wire, the agent's loop changes the conversation. Each is a fault name of its own
(``ask_again``) and composes with one wire fault as ``WIRE+CONVERSATION``
(``lost_reply+ask_again``): a cell stays (model, prompt, task, fault, protection)."""

BOTH_CONVERSATIONS = "compaction+ask_again"
"""Both conversation faults in one trial, in the order they happen: the context is compacted
after the first mutating result, then the user asks again after the final answer."""

CONVERSATIONS = (*CONVERSATION_FAULTS, BOTH_CONVERSATIONS)
"""What a fault name may end with after its wire fault: one conversation fault, or both."""


def get_fault(name: str) -> Fault:
    """The built-in fault called ``name``: a wire fault (:data:`FAULTS`), a conversation
    fault (:data:`CONVERSATION_FAULTS`), or one of each joined by ``+`` (``lost_reply+ask_again``);
    both conversation faults are :data:`BOTH_CONVERSATIONS` (``lost_reply+compaction+ask_again``).

    Raises:
        ValueError: naming the bad value and the accepted ones.
    """
    if name in FAULTS:
        return FAULTS[name]
    # Any order finds the one match: what is left before a conversation fault must be a wire
    # fault, which no conversation fault (nor a part of BOTH_CONVERSATIONS) is.
    for conversation in CONVERSATIONS:
        if name == conversation:
            return replace(NoFault(), name=name, conversation=conversation)
        wire = name.removesuffix("+" + conversation)
        if wire != name and wire in FAULTS:
            return replace(FAULTS[wire], name=name, conversation=conversation)
    raise ValueError(
        f"unknown fault {name!r}; expected one of: {', '.join([*FAULTS, *CONVERSATION_FAULTS])}, "
        f"or a fault and a conversation fault joined by '+' (lost_reply+ask_again; both "
        f"conversation faults, in the order they happen: {BOTH_CONVERSATIONS})"
    )
