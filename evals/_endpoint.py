"""Model endpoints that cannot be reached: bounded, named, and never echoing a key.

Inspect retries a failing provider call without end by default. ``twice run`` bounds each
call (``--timeout``, ``--max-retries``) and puts a guard on every model it loads:

* a provider error has the environment's API keys scrubbed from it before inspect records
  it (a gateway's 401 can echo the ``Authorization`` header into the message);
* the provider's SDK client does not retry on its own (the OpenAI and Anthropic clients retry
  twice by default, inside each of inspect's attempts): ``--max-retries N`` means N + 1
  requests per call, and the attempts the guard counts are the requests sent;
* once a model is known unreachable (a 401/403/404, or ``max_retries + 1`` failed attempts in
  a row with no success between: refused connections, 5xx, timeouts), every later call fails
  at once instead of spending the retry budget again for each trial. The run then ends with
  exit 1 and one line naming the endpoint and the reason.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
from inspect_ai.model import Model
from twice.tasks import scrub, scrub_value, secret_values

from ._secrets import redact_url

FATAL_STATUS = {401: "unauthorized", 403: "forbidden", 404: "not found"}
"""HTTP statuses no retry can fix: the key or the endpoint is wrong."""


class ModelUnreachableError(RuntimeError):
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
        label = FATAL_STATUS.get(status, "server error" if status >= 500 else "error")
        return f"HTTP {status} {label} ({kind}: {first})"
    return f"{kind}: {first}" if first else kind


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


@dataclass
class EndpointState:
    """What the guard knows about one model's endpoint."""

    model: str
    endpoint: str
    max_failures: int
    attempt_timeout: float | None
    failures: int = 0
    calls: int = 0
    down: str | None = None
    """Why the endpoint is considered unreachable; None while it is not."""
    last: list[str] = field(default_factory=list)

    def line(self) -> str:
        """The one line ``twice run`` prints for an unreachable model."""
        return f"model {self.model!r} at {self.endpoint} could not be reached: {self.down}"


def guard_model(model: Model, *, max_retries: int, attempt_timeout: float | None) -> EndpointState:
    """Put the guard on ``model`` (see the module docstring) and return its state."""
    state = EndpointState(
        model=str(model),
        endpoint=endpoint_of(model),
        max_failures=max_retries + 1,
        attempt_timeout=attempt_timeout,
    )
    api = model.api
    generate = api.generate

    def failed(reason: str, fatal: bool) -> None:
        state.failures += 1
        state.last.append(reason)
        if state.down is None and (fatal or state.failures >= state.max_failures):
            attempts = "" if fatal else f" ({state.failures} attempts in a row failed)"
            state.down = f"{reason}{attempts}"

    async def guarded(*args: Any, **kwargs: Any) -> Any:
        if state.down is not None:
            raise ModelUnreachableError(state.line())
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
            if status is None or status in FATAL_STATUS or status >= 500 or status == 408:
                reason = _reason(ex)
                if status == 404 and getattr(api, "responses_api", False) is True:
                    # Inspect sends a model name it does not know to the Responses API; most
                    # OpenAI-compatible servers (vLLM, llama.cpp, gateways) have only chat.
                    reason += (
                        "; inspect used the Responses API (/responses): for a server with "
                        "chat completions only, add -M responses_api=false"
                    )
                failed(reason, fatal=status in FATAL_STATUS)
            raise
        except anyio.get_cancelled_exc_class():
            # Inspect's attempt timeout cancels the call: count it when it is that.
            waited = time.monotonic() - started
            if attempt_timeout is not None and waited >= attempt_timeout * 0.9:
                failed(f"no answer within {attempt_timeout:g} s", fatal=False)
            raise
        state.failures = 0
        return result

    api.generate = guarded  # type: ignore[method-assign]
    return state
