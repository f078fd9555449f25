"""Fault names: the wire faults, the conversation faults, and the two joined by '+'."""

from __future__ import annotations

import pytest
from twice.mocks import CONVERSATION_FAULTS, FAULTS, LostReply, NoFault, get_fault


def test_fault_names_conversation_fault_alone_leaves_the_wire_alone() -> None:
    fault = get_fault("ask_again")
    assert isinstance(fault, NoFault)
    assert (fault.name, fault.conversation) == ("ask_again", "ask_again")


def test_fault_names_composed_fault_is_the_wire_fault_with_a_conversation() -> None:
    fault = get_fault("lost_reply+compaction")
    assert isinstance(fault, LostReply)
    assert (fault.name, fault.conversation, fault.commits) == (
        "lost_reply+compaction",
        "compaction",
        True,
    )


def test_fault_names_wire_faults_have_no_conversation() -> None:
    assert all(get_fault(name).conversation is None for name in FAULTS)
    assert set(CONVERSATION_FAULTS) == {"ask_again", "compaction"}


@pytest.mark.parametrize(
    "name",
    [
        "ask_again+lost_reply",
        "lost_reply+lost_reply",
        "bogus+ask_again",
        "ask_again+compaction",
        "",
    ],
)
def test_fault_names_bad_composition_is_refused_naming_what_is_accepted(name: str) -> None:
    with pytest.raises(ValueError, match="joined by '\\+'") as info:
        get_fault(name)
    assert repr(name) in str(info.value) and "ask_again" in str(info.value)


def test_fault_names_an_attempt_records_the_wire_fault_that_hit_it() -> None:
    assert get_fault("lost_reply+ask_again").wire_name == "lost_reply"
    assert get_fault("compaction").wire_name == "none"
    assert get_fault("lost_reply").wire_name == "lost_reply"


@pytest.mark.parametrize(
    ("name", "wire"),
    [("compaction+ask_again", "none"), ("lost_reply+compaction+ask_again", "lost_reply")],
)
def test_fault_names_both_conversation_faults_in_the_order_they_happen(
    name: str, wire: str
) -> None:
    fault = get_fault(name)
    assert fault.changes("compaction") and fault.changes("ask_again")
    assert (fault.name, fault.wire_name) == (name, wire)
    assert not get_fault("lost_reply+ask_again").changes("compaction")
    assert not get_fault("lost_reply").changes("ask_again")
    with pytest.raises(ValueError, match="compaction\\+ask_again"):
        get_fault("ask_again+compaction")  # asked again first: then nothing is left to compact
