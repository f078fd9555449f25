"""Provider outages cost time, not trials: per-call backoff honouring Retry-After, an endpoint
unreachable only when nothing succeeded for the outage window, and a run that outlasts it
ends resumably (the rerun runs only the trials it left).

End-to-end tests run ``twice run`` against the fake endpoint on 127.0.0.1 (conftest
``llm_server``) with a fast backoff; the documented defaults are checked on the policy object.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from twice.evals.run import _endpoint
from twice.evals.run._endpoint import (
    ANNOUNCE_AFTER,
    ANNOUNCE_EVERY,
    DEFAULT_BACKOFF,
    Backoff,
    EndpointState,
    ModelUnreachableError,
    is_transient,
    retry_after,
)
from twice.evals.suite import DEFAULT_OUTAGE_WINDOW, SuiteError, load_suite, suite_from_flags

Twice = Callable[..., Any]
MODEL = "openai-api/fake/refunder"
OVERLOADED = (529, {})
RATES = ("completion_rate", "duplication_rate", "exactly_once_rate", "safe_success_rate")


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Waits of 0.25-0.5 s up to 1 s: an outage test takes seconds, not minutes."""
    monkeypatch.setattr(_endpoint, "DEFAULT_BACKOFF", Backoff(base=0.5, cap=1.0))
    yield


def _run(twice: Twice, log_dir: Path, *extra: str) -> Any:
    return twice(
        "run", "--model", MODEL, "--task", "refund", "--fault", "lost_reply",
        "--log-dir", log_dir, "--display", "none", *extra,
    )  # fmt: skip


def _summary(log_dir: Path) -> dict[str, Any]:
    return json.loads((log_dir / "summary.json").read_text())  # type: ignore[no-any-return]


# -- end to end ----------------------------------------------------------------------------


def test_outage_of_10_s_at_16_connections_costs_time_not_trials(
    twice: Twice, llm_server: Any, fast_backoff: None, tmp_path: Path
) -> None:
    # The failing path: 16 calls in flight failed together, the guard counted their failures
    # "in a row" and condemned the endpoint after a few seconds: exit 1, most trials errored.
    clean = _run(twice, tmp_path / "clean", "--epochs", "2", "--max-connections", "16")
    assert clean.exit_code == 0, clean.output
    outage: dict[str, float] = {}

    def fault(n: int) -> tuple[int, dict[str, str]] | None:
        if n - len(first_run) < 60:  # the middle of the run: 60 requests answered first
            return None
        start = outage.setdefault("start", time.monotonic())
        return OVERLOADED if time.monotonic() - start < 10 else None

    first_run = list(llm_server.log)
    llm_server.fault = fault
    result = _run(twice, tmp_path / "outage", "--epochs", "2", "--max-connections", "16")
    assert result.exit_code == 0, result.output
    statuses = [status for _, status, _ in llm_server.log[len(first_run) :]]
    assert statuses.count(529) >= 16  # the outage hit calls in flight, more than once each
    summary = _summary(tmp_path / "outage")
    assert summary["status"] == "complete" and "errored" not in summary
    (cell,) = summary["cells"]
    (reference,) = _summary(tmp_path / "clean")["cells"]
    assert (cell["trials"], cell["errors"]) == (56, 0)
    assert {k: cell[k] for k in RATES} == {k: reference[k] for k in RATES}
    # While calls waited, stderr said so: what failed, how many wait, when they try again.
    waiting = [line for line in result.stderr.splitlines() if "waiting, next try in" in line]
    assert waiting and f"twice: {MODEL}: HTTP 529 overloaded" in waiting[0], result.stderr
    assert len(waiting) <= 10 / ANNOUNCE_EVERY + 2  # at a bounded rate, not once per call
    assert f"twice: {MODEL}: answering again after" in result.stderr


def test_outage_outlasting_the_window_ends_resumably_and_the_rerun_runs_only_the_rest(
    twice: Twice, llm_server: Any, fast_backoff: None, tmp_path: Path
) -> None:
    log_dir = tmp_path / "logs"
    down = {"on": True}
    # 150 requests are 50 trials' worth (a lost reply costs a trial three model calls).
    llm_server.fault = lambda n: OVERLOADED if n >= 150 and down["on"] else None
    args = ("--epochs", "3", "--max-connections", "16", "--outage-window", "3")
    started = time.monotonic()
    result = _run(twice, log_dir, *args)
    elapsed = time.monotonic() - started
    assert result.exit_code == 1, result.output
    first_529 = next(t for t, status, _ in llm_server.log if status == 529)
    # The window (3 s), the last backoff (1 s) and the errored trials' bookkeeping.
    assert time.monotonic() - first_529 < 25, f"ended {time.monotonic() - first_529:.0f} s after"
    assert elapsed < 90
    assert f"error: model {MODEL!r} at {llm_server.url} could not be reached: HTTP 529" in (
        result.stderr
    )
    assert "no call succeeded for 3 s" in result.stderr
    summary = _summary(log_dir)
    assert summary["status"] == "incomplete"
    (line,) = summary["unreachable"]
    assert "HTTP 529 overloaded" in line
    (left,) = summary["left"]
    assert left["trials"] == summary["errored"] == len(left["samples"]) > 0
    (cell,) = summary["cells"]
    assert (cell["trials"], cell["errors"]) == (84, left["trials"])  # left out of the rates
    assert f"twice: {left['trials']} trial(s) left" in result.stderr

    down["on"] = False
    before = len(llm_server.log)
    again = _run(twice, log_dir, *args)
    assert again.exit_code == 0, again.output
    assert llm_server.starts(before) == left["trials"]  # only the trials left, no others
    summary = _summary(log_dir)
    assert summary["status"] == "complete" and "left" not in summary
    assert (summary["cells"][0]["trials"], summary["cells"][0]["errors"]) == (84, 0)


def test_outage_a_429_with_retry_after_is_waited_out(
    twice: Twice, llm_server: Any, tmp_path: Path
) -> None:
    # The failing path: --max-retries 0 gave a rate-limited call no retry at all, and
    # inspect's own wait (3 s and more) never read Retry-After.
    llm_server.fault = lambda n: (429, {"retry-after": "3"}) if n == 1 else None
    result = twice(
        "run", "--model", MODEL, "--task", "refund", "--fault", "none", "--limit", "1",
        "--log-dir", tmp_path / "logs", "--display", "none", "--max-retries", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (_, ok, _), (limited, status, _), (retried, *_) = llm_server.log[:3]
    assert (ok, status) == (200, 429)
    assert retried - limited >= 3, f"retried after {retried - limited:.2f} s"
    assert "HTTP 429 rate limited (Retry-After 3 s), 1 call waiting" in result.stderr
    assert _summary(tmp_path / "logs")["cells"][0]["errors"] == 0


def test_outage_a_dead_endpoint_still_ends_the_run_within_30_s_with_the_defaults(
    twice: Twice, llm_server: Any, tmp_path: Path
) -> None:
    llm_server.fault = lambda n: (503, {})
    started = time.monotonic()
    result = twice(
        "run", "--model", MODEL, "--task", "refund", "--fault", "none", "--limit", "4",
        "--log-dir", tmp_path / "logs", "--display", "none",
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.exit_code == 1, result.output
    assert "(4 attempt(s) of one call failed in a row and no call has succeeded)" in (result.stderr)
    assert elapsed < 30, f"took {elapsed:.0f} s"
    assert "no call has succeeded yet" in result.stderr


def test_outage_a_401_is_fatal_at_once(twice: Twice, llm_server: Any, tmp_path: Path) -> None:
    llm_server.fault = lambda n: (401, {})
    started = time.monotonic()
    result = twice(
        "run", "--model", MODEL, "--task", "refund", "--fault", "none", "--limit", "1",
        "--log-dir", tmp_path / "logs", "--display", "none",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert len(llm_server.log) == 1  # no retry, no backoff
    assert time.monotonic() - started < 20
    assert "could not be reached: HTTP 401 unauthorized" in result.stderr


# -- the policy, with the documented defaults ----------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _state(clock: Clock, lines: list[str] | None = None, **kw: Any) -> EndpointState:
    said = lines if lines is not None else []
    return EndpointState(
        model="openai/x", endpoint="http://127.0.0.1:1/v1", max_failures=4,
        attempt_timeout=300, clock=clock, rng=random.Random(7), say=said.append, **kw,
    )  # fmt: skip


class _Refused(Exception):
    """A provider error with an HTTP reply (status and headers), as the SDKs raise."""

    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status
        self.response = httpx.Response(status, headers=headers or {})


def test_outage_policy_defaults_are_documented() -> None:
    assert DEFAULT_OUTAGE_WINDOW == 300
    assert (DEFAULT_BACKOFF.base, DEFAULT_BACKOFF.cap) == (2.0, 30.0)
    rng = random.Random(1)
    for attempt, top in [(1, 2), (2, 4), (3, 8), (4, 16), (5, 30), (9, 30), (500, 30)]:
        for _ in range(50):  # equal jitter: between half the step and the step
            assert top / 2 <= DEFAULT_BACKOFF.delay(attempt, rng) <= top


def test_outage_policy_concurrent_failures_are_not_failures_in_a_row() -> None:
    clock = Clock()
    state = _state(clock)
    state.success()
    for call in range(16):  # a burst: 16 calls in flight fail at once, each more than once
        for attempt in (1, 2, 3, 4, 5):
            state.failure("HTTP 529 overloaded")
            assert state.wait(call, attempt, _Refused(529)) > 0
    state.check()  # not down: the burst is seconds old
    clock.now += DEFAULT_OUTAGE_WINDOW - 1
    state.check()
    state.success()  # the outage ended inside the window
    clock.now += DEFAULT_OUTAGE_WINDOW + 1
    state.check()  # no failure since: an idle endpoint is not a dead one


def test_outage_policy_a_window_without_success_makes_the_endpoint_unreachable() -> None:
    clock = Clock()
    state = _state(clock)
    state.success()
    state.failure("HTTP 503 server error")
    clock.now += 200
    # The wait never runs past the window: the call wakes when it closes, to find it closed.
    assert state.wait(1, 9, _Refused(503, {"retry-after": "600"})) == pytest.approx(100)
    clock.now += 100
    with pytest.raises(ModelUnreachableError, match=r"no call succeeded for 300 s"):
        state.check()
    assert state.wait(2, 1, _Refused(503)) == 0  # every later call fails at once
    assert "could not be reached: HTTP 503 server error" in state.line()


def test_outage_policy_a_never_answered_endpoint_is_dead_after_one_calls_retries() -> None:
    clock = Clock()
    state = _state(clock)
    for call in range(16):  # concurrent first attempts: none condemns the endpoint
        state.failure("APIConnectionError: Connection error.")
        assert state.wait(call, 1, ConnectionRefusedError()) > 0
    assert state.wait(0, 2, None) > 0 and state.wait(0, 3, None) > 0
    assert state.down is None
    assert state.wait(0, 4, None) == 0  # --max-retries 3: one call's fourth failed attempt
    assert state.down == (
        "APIConnectionError: Connection error. (4 attempt(s) of one call failed in a row and "
        "no call has succeeded)"
    )
    answered = _state(clock)
    answered.success()
    answered.failure("HTTP 500 server error")
    assert answered.wait(0, 40, None) > 0 and answered.down is None  # then the window rules


def test_outage_policy_honours_retry_after() -> None:
    clock = Clock()
    state = _state(clock)
    state.success()
    state.failure("HTTP 429 rate limited")
    assert state.wait(0, 1, _Refused(429, {"retry-after": "3"})) >= 3
    assert state.wait(1, 1, _Refused(429, {"retry-after-ms": "12500"})) >= 12.5
    assert state.wait(2, 1, _Refused(429)) <= 2  # none asked: the backoff


def test_outage_policy_says_it_is_waiting_at_a_bounded_rate() -> None:
    clock = Clock()
    lines: list[str] = []
    state = _state(clock, lines)
    state.success()
    state.failure("HTTP 500 server error")
    assert state.wait(99, 1, _Refused(500)) <= ANNOUNCE_AFTER
    state.success()
    assert lines == []  # a blip retried at once is not news
    for call in range(14):
        state.failure("HTTP 529 overloaded")
        state.wait(call, 3, _Refused(529))
    assert len(lines) == 1  # 14 calls began to wait: one line
    clock.now += ANNOUNCE_EVERY / 2
    for call in range(13):
        state.wait(call, 4, _Refused(529))
    assert len(lines) == 1
    clock.now += ANNOUNCE_EVERY / 2 + 1
    state.wait(13, 4, _Refused(529))
    assert len(lines) == 2
    assert lines[1].startswith("twice: openai/x: HTTP 529 overloaded, 14 calls waiting, next ")
    assert lines[1].endswith("; unreachable in 289 s unless a call succeeds")
    state.success()
    assert lines[2] == "twice: openai/x: answering again after 11 s"


def test_outage_which_failures_are_an_outages() -> None:
    transient = [None, 408, 429, 500, 502, 503, 529, 200]  # 200: a stream that failed midway
    assert all(is_transient(s) for s in transient)
    assert not any(is_transient(s) for s in (400, 401, 403, 404, 413, 422))


def test_outage_retry_after_forms() -> None:
    def ra(headers: dict[str, str]) -> float | None:
        return retry_after(_Refused(429, headers))

    assert ra({"retry-after": "3"}) == 3
    assert ra({"retry-after": "0.5"}) == 0.5
    assert ra({"retry-after-ms": "250"}) == 0.25
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= (ra({"retry-after": soon}) or 0) <= 31
    for bad in ("soon", "-1", "inf", "nan", ""):
        assert ra({"retry-after": bad}) is None, bad
    assert ra({}) is None and retry_after(ValueError("no reply")) is None


# -- the setting ---------------------------------------------------------------------------


def test_outage_window_suite_key_and_flag(tmp_path: Path) -> None:
    path = tmp_path / "suite.toml"
    path.write_text('outage_window = 42\n[[matrix]]\nmodels = ["stub/retry"]\n')
    assert load_suite(path).outage_window == 42
    flags = dict(models=(), prompts=(), tasks=(), faults=(), protections=(), epochs=None)
    assert suite_from_flags(config=str(path), limit=None, **flags).outage_window == 42
    assert (
        suite_from_flags(config=str(path), limit=None, outage_window=7, **flags).outage_window == 7
    )
    path.write_text('outage_window = "5m"\n[[matrix]]\nmodels = ["stub/retry"]\n')
    with pytest.raises(SuiteError, match=r"'outage_window' must be a positive integer, got '5m'"):
        load_suite(path)


def test_outage_window_flag_refuses_zero(twice: Twice, tmp_path: Path) -> None:
    result = twice("run", "--model", "stub/retry", "--outage-window", "0", "--log-dir", tmp_path)
    assert result.exit_code == 2
    assert "--outage-window" in result.stderr and "0" in result.stderr


def test_outage_guard_counts_a_4xx_as_an_answer_and_a_401_as_fatal() -> None:
    from inspect_ai.model import get_model

    model = get_model("mockllm/model", memoize=False)
    replies: list[BaseException] = []

    async def provider(*args: Any, **kwargs: Any) -> Any:
        raise replies.pop(0)

    model.api.generate = provider  # type: ignore[method-assign]
    state = _endpoint.guard_model(model, max_retries=3, attempt_timeout=300)
    for reply in (_Refused(503), _Refused(400), _Refused(529), _Refused(401)):
        replies.append(reply)
        with pytest.raises(_Refused):
            asyncio.run(model.api.generate())
        if reply.status_code == 400:  # the request was wrong; the endpoint answered it
            assert state.answered and state.failing_since is None and state.down is None
        elif reply.status_code in (503, 529):
            assert state.failing_since is not None and state.down is None
    assert state.down is not None and state.down.startswith("HTTP 401 unauthorized")
    with pytest.raises(ModelUnreachableError, match="could not be reached: HTTP 401"):
        asyncio.run(model.api.generate())  # every later call fails at once


def test_outage_a_workers_run_summary_names_what_was_unreachable_and_left(
    llm_server: Any, tmp_path: Path
) -> None:
    # The failing path: the merged summary of a --workers run had neither `unreachable` nor
    # `left`, which a one-process run's summary has: a rerun's user could not tell what was left.
    # A `twice run` process of its own, as a user's: this one runs the fake endpoint's thread,
    # with which its workers could not be forks.
    llm_server.fault = lambda n: (503, {})
    log_dir = tmp_path / "logs"
    result = subprocess.run(
        [sys.executable, "-m", "twice.evals.cli", "run", "--model", MODEL, "--task", "refund",
         "--fault", "none", "--fault", "lost_reply", "--limit", "2", "--workers", "2",
         "--log-dir", str(log_dir), "--display", "none"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    summary = _summary(log_dir)
    assert summary["unreachable"] and all(MODEL in line for line in summary["unreachable"])
    left = summary["left"]
    assert {c["fault"] for c in left} == {"none", "lost_reply"}
    assert sum(c["trials"] for c in left) == summary["errored"] > 0
    assert all(c["trials"] == len(c["samples"]) for c in left)
    assert f"error: model {MODEL!r} at {llm_server.url} could not be reached" in result.stderr
    assert "trial(s) left (summary.json names them)" in result.stderr
