import pytest
from payments_client import refund
from twice.assertions import assert_side_effects, exactly, no_unseen_effects


@pytest.mark.parametrize("twice_fault", ["none", "lost_reply", "timeout_before_commit"])
def test_refund_happens_exactly_once(twice_fault, ledger):
    refund("order_1042", 499)
    assert_side_effects(ledger, exactly(1, "payments.refund.create", order_id="order_1042"))


@pytest.mark.twice_mock(fault="lost_reply")
def test_refund_returns_the_refund_it_made(twice_mock):
    refund_id = refund("order_1042", 499)
    twice_mock.observe(f"Refunded {refund_id}.")  # what the agent would be told
    twice_mock.assert_side_effects(
        exactly(1, "payments.refund.create", order_id="order_1042"),
        no_unseen_effects(),
    )
