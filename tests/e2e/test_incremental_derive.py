"""Incremental DeriveMessages: a caller that holds (event_count, replace_generation) gets O(new)."""

from __future__ import annotations

from typing import Any

from sessionlog.testing import RunningServer
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import ASSISTANT, STEP_START, USER, append, replace, say


def derive(stub: object, session_id: str, **known: Any) -> pb.DeriveMessagesResponse:
    request = pb.DeriveMessagesRequest(session_id=session_id, **known)
    reply: pb.DeriveMessagesResponse = stub.DeriveMessages(request)  # type: ignore[attr-defined]
    return reply


def test_no_replace_since_returns_only_the_new_messages(server: RunningServer) -> None:
    """After plain appends the reply holds just the new messages; appended to the old list
    they equal a full derive."""
    stub = server.stub()
    append(stub, "s", say("one"), say("two", ASSISTANT))
    first = derive(stub, "s")
    assert not first.incremental
    append(stub, "s", say("x", STEP_START), say("three"), say("four", ASSISTANT))
    tail = derive(
        stub,
        "s",
        known_event_count=first.event_count,
        known_replace_generation=first.replace_generation,
    )
    assert tail.incremental
    assert [m.content for m in tail.messages] == ["three", "four"]
    assert list(tail.seqs) == [3, 4]
    full = derive(stub, "s")
    assert list(first.messages) + list(tail.messages) == list(full.messages)
    assert list(first.seqs) + list(tail.seqs) == list(full.seqs)
    assert (tail.event_count, tail.replace_generation) == (full.event_count, 0)


def test_nothing_new_is_an_empty_increment(server: RunningServer) -> None:
    """Deriving again with the current numbers returns no messages, incrementally."""
    stub = server.stub()
    append(stub, "s", say("one"))
    first = derive(stub, "s")
    again = derive(stub, "s", known_event_count=first.event_count, known_replace_generation=0)
    assert again.incremental
    assert list(again.messages) == []


def test_a_replace_since_returns_the_full_list(server: RunningServer) -> None:
    """A replace after the caller's count changes the generation: the full list comes back."""
    stub = server.stub()
    append(stub, "s", say("a"), say("b", ASSISTANT), say("c"))
    first = derive(stub, "s")
    append(stub, "s", replace(0, 1, "[summary]"))
    reply = derive(stub, "s", known_event_count=first.event_count, known_replace_generation=0)
    assert not reply.incremental
    assert [m.content for m in reply.messages] == ["[summary]", "c"]
    assert reply.replace_generation == 1


def test_numbers_that_are_not_the_sessions_get_the_full_list(server: RunningServer) -> None:
    """A count past the end or a wrong generation is answered with the whole list."""
    stub = server.stub()
    append(stub, "s", say("a", USER))
    for known in (
        {"known_event_count": 9},
        {"known_event_count": 0, "known_replace_generation": 3},
    ):
        reply = derive(stub, "s", **known)
        assert not reply.incremental
        assert [m.content for m in reply.messages] == ["a"]
