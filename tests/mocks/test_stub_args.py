"""Stub model args (``-M``): every value checked, the accepted ones named."""

from __future__ import annotations

import pytest
from twice.mocks import StubAPI

WHOLE = "attempts for stub/retry must be a whole number >= 1"


@pytest.mark.parametrize(
    ("model", "args", "message"),
    [
        ("noisy", {"p": 7}, "p for stub/noisy must be a number from 0 to 1, got 7"),
        ("noisy", {"p": -0.1}, "p for stub/noisy must be a number from 0 to 1, got -0.1"),
        ("noisy", {"p": "often"}, "p for stub/noisy must be a number from 0 to 1, got 'often'"),
        ("retry", {"p": 0.3}, "p for stub/retry: only stub/noisy takes p (its retry probability)"),
        ("retry", {"attempts": 0}, f"{WHOLE}, got 0"),
        ("retry", {"attempts": 2.5}, f"{WHOLE}, got 2.5"),
        ("retry", {"attempts": True}, f"{WHOLE}, got True"),
        ("retry", {"delay": -1}, "delay for stub/retry must be a number >= 0, got -1"),
        # it listed p, which the next message refuses to stub/retry
        ("retry", {"temperature": 1}, "unknown model args for stub/retry: temperature; "
         "stub/retry accepts attempts, delay"),
        ("noisy", {"temperature": 1}, "unknown model args for stub/noisy: temperature; "
         "stub/noisy accepts attempts, delay, p"),
    ],
)  # fmt: skip
def test_stub_rejects_a_bad_model_arg(model: str, args: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as err:
        StubAPI(model, **args)  # type: ignore[arg-type]
    assert str(err.value).startswith(message)


def test_stub_accepts_good_model_args_given_as_text() -> None:
    stub = StubAPI("noisy", p="0.3", attempts="4", delay="0.5")  # type: ignore[arg-type]
    assert (stub.p, stub.attempts, stub.delay) == (0.3, 4, 0.5)
