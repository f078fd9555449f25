"""Model endpoints: an outage costs time, not trials; a dead endpoint ends the run.

``twice run`` puts a guard on every model it loads. Inspect retries a failed provider call
(its own retry loop: one attempt is one request, ``--timeout`` bounds each); the guard decides
how long to wait between attempts and when an endpoint counts as unreachable:

* **Backoff per call.** A transient failure (HTTP 5xx, 529 overloaded, 429 rate limited,
  408, a refused or reset connection, an attempt that timed out) is retried after an
  exponential backoff with jitter (:class:`Backoff`: 1-2 s, 2-4 s, ... at most 30 s), never
  sooner than the reply's ``Retry-After`` asks. Each call counts only its own attempts:
  failures of calls running concurrently are never "failures in a row".
* **Unreachable** means no call has succeeded for the outage window (``--outage-window``,
  suite key ``outage_window``, default :data:`DEFAULT_OUTAGE_WINDOW` = 300 s) and every call
  that ended in it failed; or, before any call ever succeeded, one call failed
  ``--max-retries + 1`` attempts in a row (a dead endpoint ends a run in about 10 s); or at
  once on 401/403/404, which no retry fixes. Then every later call fails at once
  (:class:`ModelUnreachableError`), the run ends with exit 1 and one line naming the
  endpoint and the reason, and the trials that did not run are left for the rerun.
* While calls wait (longer than a blip), stderr says so at most every
  :data:`ANNOUNCE_EVERY` seconds per model ("twice: openai/gpt-4o: HTTP 529 overloaded, 14
  calls waiting, next try in 8 s; unreachable in 280 s unless a call succeeds").
* A provider error has the environment's API keys scrubbed from it before inspect records
  it (a gateway's 401 can echo the ``Authorization`` header into the message).
* The provider's SDK client does not retry on its own (the OpenAI and Anthropic clients retry
  twice by default, inside each of inspect's attempts): the attempts the guard counts are
  the requests sent.

Why the backoff lives in inspect's loop (through the provider's ``retry_wait`` hook) and not
in a loop of the guard's: each attempt stays one model event in the log and its wait a wait
of the sample, and ``--timeout`` keeps bounding one request; twice's wait replaces inspect's
(exponential from 3 s up to 30 minutes), which ignores ``Retry-After``. Inspect counts no
retries itself (``max_retries`` unset): its count would end a call in the middle of an outage
the window rides out. Its per-call ``timeout`` is ``--timeout`` + the window, the bound on a
call that keeps failing alone while other calls succeed.
"""

from __future__ import annotations

import contextlib
import email.utils
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from inspect_ai.model import Model
from twice.mocks import RunError
from twice.tasks import scrub, scrub_value, secret_values

from ..suite import DEFAULT_OUTAGE_WINDOW
from ._secrets import redact_url

if TYPE_CHECKING:  # inspect's retry loop is tenacity's; twice only gives it a wait
    from tenacity import RetryCallState

FATAL_STATUS = {401: "unauthorized", 403: "forbidden", 404: "not found"}
"""HTTP statuses no retry can fix: the key or the endpoint is wrong."""

TRANSIENT_STATUS = {408: "request timeout", 429: "rate limited", 529: "overloaded"}
"""HTTP statuses below 500 (and 529, Anthropic's "overloaded") that an outage answers with:
retried, and counted against the outage window. Every other 5xx is one too."""

ANNOUNCE_EVERY = 10.0
"""Seconds between two stderr lines about one model's waiting calls."""

ANNOUNCE_AFTER = 2.0
"""Failures retried within this many seconds pass without a line: a blip is not news, and
by then the calls a burst hit are all waiting, so the line counts them."""


class ModelUnreachableError(RunError, RuntimeError):
    """Raised for every model call once the model's endpoint is known unreachable."""


def _status(ex: BaseException) -> int | None:
    for obj in (ex, getattr(ex, "response", None)):
        code = getattr(obj, "status_code", None)
        if isinstance(code, int):
            return code
    return None


def _reason(ex: BaseException) -> str:
    """One line: what went wrong, provider-neutral, secrets scrubbed."""
    status = _status(ex)
    first = (str(ex).strip().splitlines() or [""])[0]
    first = scrub(first)
    if len(first) > 200:
        first = first[:197] + "..."
    kind = type(ex).__name__
    if status is not None:
        return f"{_status_label(status)} ({kind}: {first})"
    return f"{kind}: {first}" if first else kind


def _status_label(status: int) -> str:
    label = FATAL_STATUS.get(status) or TRANSIENT_STATUS.get(status)
    return f"HTTP {status} {label or ('server error' if status >= 500 else 'error')}"


def is_transient(status: int | None) -> bool:
    """Whether a failed call's HTTP status (None: no reply, a connection that failed) is one
    an outage answers with, worth waiting out. A status below 400 on an error is one too: a
    stream that began 200 and then failed (an SSE ``error`` event) is no answer."""
    return status is None or status >= 500 or status < 400 or status in TRANSIENT_STATUS


def retry_after(ex: BaseException | None) -> float | None:
    """Seconds a failed call's reply asks the client to wait (``Retry-After`` as seconds or
    an HTTP date, or ``retry-after-ms``); None when it asks nothing usable."""
    headers = getattr(getattr(ex, "response", None), "headers", None)
    if headers is None:
        return None
    with contextlib.suppress(Exception):  # any headers object: a malformed one asks nothing
        ms = headers.get("retry-after-ms")
        if ms is not None and math.isfinite(float(ms)) and float(ms) >= 0:
            return float(ms) / 1000
    value = None
    with contextlib.suppress(Exception):
        value = headers.get("retry-after")
    if not isinstance(value, str) or not value.strip():
        return None
    with contextlib.suppress(ValueError):
        seconds = float(value)
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    with contextlib.suppress(TypeError, ValueError, IndexError):
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    return None


def scrub_exception(ex: BaseException, secrets: list[str] | None = None) -> None:
    """Remove API keys from an exception (and the ones it chains) in place.

    Inspect records a failed call from the exception it sees (message, traceback, the
    sample's error), so scrubbing it before it propagates keeps keys out of the log.
    """
    keys = secret_values() if secrets is None else secrets
    if not keys:
        return
    seen: set[int] = set()
    todo: list[BaseException | None] = [ex]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.args = tuple(scrub_value(a, keys) for a in e.args)
        for attr in ("message", "body", "doc"):
            value = getattr(e, attr, None)
            if isinstance(value, str | dict | list):
                # A read-only attribute keeps its text; the args are scrubbed all the same.
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(e, attr, scrub_value(value, keys))
        todo += [e.__cause__, e.__context__]


def endpoint_of(model: Model) -> str:
    """Where a model's calls go, fit to print (credentials in the URL redacted)."""
    api = model.api
    url = api.base_url
    if not url:
        client = getattr(api, "client", None)
        url = str(getattr(client, "base_url", "") or "") or None
    return redact_url(str(url)) if url else "its provider's default endpoint"


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter between the attempts of one call.

    The wait after a call's n-th failed attempt is drawn from [d/2, d] with
    d = min(cap, base × 2^(n-1)): calls that failed together spread out ("equal jitter"),
    and none retries at once.
    """

    base: float = 2.0
    cap: float = 30.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after a call's ``attempt``-th failed attempt (1 for the first)."""
        d = min(self.cap, self.base * 2.0 ** min(max(attempt - 1, 0), 60))
        return d / 2 + rng.uniform(0, d / 2)


DEFAULT_BACKOFF = Backoff()
"""The backoff of every guarded model (a test may give a faster one)."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class EndpointState:
    """What the guard knows about one model's endpoint, and its outage policy.

    The clock and random source are fields so the policy can be tested without waiting.
    """

    model: str
    endpoint: str
    max_failures: int
    """Attempts of one call that, before any call succeeded, condemn the endpoint."""
    attempt_timeout: float | None
    window: float = DEFAULT_OUTAGE_WINDOW
    """Seconds without a success, every call failing, before the endpoint is unreachable."""
    backoff: Backoff = DEFAULT_BACKOFF
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)
    say: Callable[[str], None] = _stderr
    calls: int = 0
    answered: bool = False
    """Whether the endpoint has answered a call of this run (a success, or a reply that is
    not an outage's, such as a 400)."""
    failing_since: float | None = None
    """When the first failure since the last answer happened; None while none did."""
    reason: str | None = None
    """The last failure, one line, secrets scrubbed."""
    down: str | None = None
    """Why the endpoint is considered unreachable; None while it is not."""
    waiting: dict[int, float] = field(default_factory=dict)
    """Calls in backoff: when each wakes."""
    said_at: float | None = None
    said_outage: bool = False

    def line(self) -> str:
        """The one line ``twice run`` prints for an unreachable model."""
        return f"model {self.model!r} at {self.endpoint} could not be reached: {self.down}"

    def check(self) -> None:
        """Before an attempt: fail it at once when the endpoint is unreachable.

        Raises:
            ModelUnreachableError: once the endpoint is down, or the outage window has passed
                with no answer.
        """
        now = self.clock()
        since = self.failing_since
        if self.down is None and since is not None and now - since >= self.window:
            self.down = (
                f"{self.reason} (no call succeeded for {now - since:.0f} s, every call "
                f"failing; --outage-window is {self.window:g} s)"
            )
        if self.down is not None:
            raise ModelUnreachableError(self.line())

    def success(self) -> None:
        """A call was answered: the outage, if any, is over."""
        now = self.clock()
        if self.failing_since is not None and self.said_outage:
            self.say(f"twice: {self.model}: answering again after {now - self.failing_since:.0f} s")
        self.answered = True
        self.failing_since = None
        self.said_outage = False

    def failure(self, reason: str, *, fatal: bool = False) -> None:
        """An attempt failed for ``reason``; ``fatal`` (401/403/404) condemns the endpoint."""
        self.reason = reason
        if self.failing_since is None:
            self.failing_since = self.clock()
        if fatal and self.down is None:
            self.down = reason

    def wait(self, call: int, attempt: int, ex: BaseException | None) -> float:
        """Seconds call ``call`` waits after its ``attempt``-th failed attempt failed with
        ``ex``: the backoff, at least the reply's ``Retry-After``, at most what is left of
        the outage window (the next attempt then finds the endpoint down). 0 once the
        endpoint is unreachable: the next attempt fails at once."""
        now = self.clock()
        if self.down is None and not self.answered and attempt >= self.max_failures:
            self.down = (
                f"{self.reason or self._label(ex)} ({attempt} attempt(s) of one call failed in "
                "a row and no call has succeeded)"
            )
            if ex is not None and _status(ex) == 429:
                self.down += (
                    "; the endpoint kept refusing: give fewer --max-connections, or a larger "
                    "--max-retries"
                )
        if self.down is not None:
            return 0.0
        asked = retry_after(ex)
        delay = max(asked or 0.0, self.backoff.delay(attempt, self.rng))
        if self.failing_since is not None:
            delay = min(delay, max(0.0, self.failing_since + self.window - now))
        self.waiting[call] = now + delay
        since = now if self.failing_since is None else self.failing_since
        if delay > ANNOUNCE_AFTER or now - since >= ANNOUNCE_AFTER:
            self._announce(ex, asked, now)
        return delay

    def _label(self, ex: BaseException | None) -> str:
        status = None if ex is None else _status(ex)
        if status is not None:
            return _status_label(status)
        if type(ex).__name__ == "AttemptTimeoutError" and self.attempt_timeout is not None:
            return f"no answer within {self.attempt_timeout:g} s"
        return type(ex).__name__

    def _announce(self, ex: BaseException | None, asked: float | None, now: float) -> None:
        if self.said_at is not None and now - self.said_at < ANNOUNCE_EVERY:
            return
        self.said_at = now
        self.said_outage = True
        self.waiting = {c: t for c, t in self.waiting.items() if t > now}
        n = len(self.waiting)
        soonest = min(self.waiting.values(), default=now) - now
        what = self._label(ex) + (f" (Retry-After {asked:g} s)" if asked else "")
        if self.answered and self.failing_since is not None:
            left = self.failing_since + self.window - now
            tail = f"; unreachable in {max(left, 0):.0f} s unless a call succeeds"
        else:
            tail = "; no call has succeeded yet"
        self.say(
            f"twice: {self.model}: {what}, {n} call{'s' if n != 1 else ''} waiting, next try "
            f"in {max(1, round(soonest))} s{tail}"
        )


class _OutageWait:
    """Inspect's wait between a call's attempts (the provider's ``retry_wait`` hook; tenacity
    calls a wait with the call's retry state)."""

    def __init__(self, state: EndpointState) -> None:
        self.state = state

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        ex = outcome.exception() if outcome is not None and outcome.failed else None
        return self.state.wait(id(retry_state), retry_state.attempt_number, ex)


def guard_model(
    model: Model,
    *,
    max_retries: int,
    attempt_timeout: float | None,
    outage_window: float = DEFAULT_OUTAGE_WINDOW,
    backoff: Backoff | None = None,
) -> EndpointState:
    """Put the guard on ``model`` (see the module docstring) and return its state.

    Args:
        model: A model whose calls go through inspect's retry loop.
        max_retries: Before any call succeeded, one call failing ``max_retries + 1``
            attempts in a row makes the endpoint unreachable.
        attempt_timeout: Seconds one attempt may take (inspect's ``attempt_timeout``).
        outage_window: Seconds without a success, every call failing, after which the
            endpoint is unreachable.
        backoff: The wait between a call's attempts; default :data:`DEFAULT_BACKOFF`.
    """
    state = EndpointState(
        model=str(model),
        endpoint=endpoint_of(model),
        max_failures=max_retries + 1,
        attempt_timeout=attempt_timeout,
        window=float(outage_window),
        backoff=DEFAULT_BACKOFF if backoff is None else backoff,
    )
    api = model.api
    generate = api.generate
    wait = _OutageWait(state)
    api.retry_wait = lambda: wait  # type: ignore[method-assign]

    async def guarded(*args: Any, **kwargs: Any) -> Any:
        state.check()
        client: Any = getattr(api, "client", None)  # providers may rebuild it: every call
        if isinstance(getattr(client, "max_retries", None), int) and client.max_retries:
            client.max_retries = 0
        state.calls += 1
        started = time.monotonic()
        try:
            result = await generate(*args, **kwargs)
        except Exception as ex:
            scrub_exception(ex)
            status = _status(ex)
            if status in FATAL_STATUS or is_transient(status):
                reason = _reason(ex)
                if status == 404 and getattr(api, "responses_api", False) is True:
                    # Inspect sends a model name it does not know to the Responses API; most
                    # OpenAI-compatible servers (vLLM, llama.cpp, gateways) have only chat.
                    reason += (
                        "; inspect used the Responses API (/responses): for a server with "
                        "chat completions only, add -M responses_api=false"
                    )
                state.failure(reason, fatal=status in FATAL_STATUS)
            else:  # a 400, 422...: the request was wrong, the endpoint is up
                state.success()
            raise
        except anyio.get_cancelled_exc_class():
            # Inspect's attempt timeout cancels the call: count it when it is that.
            waited = time.monotonic() - started
            if attempt_timeout is not None and waited >= attempt_timeout * 0.9:
                state.failure(f"no answer within {attempt_timeout:g} s")
            raise
        state.success()
        return result

    api.generate = guarded  # type: ignore[method-assign]
    return state
