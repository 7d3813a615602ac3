"""ForkSession end to end: where a fork may cut, what the child holds, and that the parent stays.

Fork copies events 0..at_seq byte for byte into a new session (SPEC §7). It refuses a cut inside
a turn (OPEN_TURN) and one past the end (BOUNDARY_OUT_OF_RANGE); a refused fork creates nothing.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import (
    ASSISTANT,
    STEP_END,
    STEP_START,
    SYSTEM,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    USER,
    Stub,
    append,
    check,
    ev,
    get,
    log_bytes,
    replace,
    say,
)

INVALID = grpc.StatusCode.INVALID_ARGUMENT


# -- helpers ------------------------------------------------------------------------------------


def fork(stub: Stub, parent: str, at_seq: int | None = None, child: str = "") -> pb.Session:
    request = pb.ForkSessionRequest(parent_session_id=parent, session_id=child)
    if at_seq is not None:
        request.at_seq = at_seq
    session: pb.Session = stub.ForkSession(request).session
    return session


def fork_error(stub: Stub, parent: str, at_seq: int | None = None, child: str = "") -> Any:
    with pytest.raises(grpc.RpcError) as caught:
        fork(stub, parent, at_seq, child)
    return caught.value


def snapshot(stub: Stub, session_id: str) -> tuple[list[bytes], bytes, bytes]:
    """The log, the description and the derived messages of a session, as bytes."""
    derived = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id=session_id))
    return (
        log_bytes(stub, session_id),
        get(stub, session_id).SerializeToString(),
        derived.SerializeToString(),
    )


def session_ids(stub: Stub) -> list[str]:
    page = stub.ListSessions(pb.ListSessionsRequest(page_size=1000))
    assert not page.next_page_token
    return [s.session_id for s in page.sessions]


def three_turns() -> list[event_pb2.Event]:
    """Two closed turns, then a third that is still open."""
    return [
        say("be brief", SYSTEM),  # 0
        ev(TURN_START),  # 1
        say("add 2 and 3"),  # 2
        ev(STEP_START),  # 3
        ev(TOOL_CALL, name="add"),  # 4
        ev(TOOL_RESULT, content="5", tool_call_id="c1"),  # 5
        ev(STEP_END),  # 6
        say("5", ASSISTANT),  # 7
        ev(TURN_END),  # 8
        ev(TURN_START),  # 9
        say("thanks"),  # 10
        say("welcome", ASSISTANT),  # 11
        ev(TURN_END),  # 12
        ev(TURN_START),  # 13
        say("one more"),  # 14
        ev(STEP_START),  # 15
    ]


#: For each seq of three_turns(): the seq of the turn a cut there would leave open, or None.
OPEN_AT = [None, *[1] * 7, None, *[9] * 3, None, 13, 13, 13]


# -- where a fork may cut -----------------------------------------------------------------------


def test_fork_at_every_boundary(stub: Stub) -> None:
    """Only cuts outside a turn are allowed; each child is the parent's prefix byte for byte."""
    events = three_turns()
    append(stub, "p", *events)
    parent = snapshot(stub, "p")
    parent_log = parent[0]
    for at in range(len(events)):
        child = f"child-{at}"
        turn = OPEN_AT[at]
        if turn is None:
            session = fork(stub, "p", at, child)
            assert (session.session_id, session.exists) == (child, True)
            assert (session.parent_session_id, session.parent_event_count) == ("p", at + 1)
            assert session.event_count == at + 1
            assert session == get(stub, child)
            assert log_bytes(stub, child) == parent_log[: at + 1]
        else:
            error = fork_error(stub, "p", at, child)
            check(
                error,
                grpc.StatusCode.FAILED_PRECONDITION,
                "OPEN_TURN",
                turn_start_seq=turn,
                at_seq=at,
            )
            assert not get(stub, child).exists
            assert log_bytes(stub, child) == []
        assert snapshot(stub, "p") == parent
    assert session_ids(stub) == sorted(["p", "child-0", "child-8", "child-12"])


def test_fork_whole_log_refused_while_a_turn_is_open(stub: Stub) -> None:
    """With at_seq unset, the whole log is the cut: an open last turn refuses it."""
    append(stub, "p", *three_turns())
    error = fork_error(stub, "p", None, "kid")
    check(error, grpc.StatusCode.FAILED_PRECONDITION, "OPEN_TURN", turn_start_seq=13)
    assert not get(stub, "kid").exists


def test_fork_without_at_seq_copies_the_whole_log(stub: Stub) -> None:
    """at_seq unset forks every event of the parent."""
    append(stub, "p", *three_turns()[:13])
    session = fork(stub, "p", None, "kid")
    assert (session.event_count, session.parent_event_count) == (13, 13)
    assert log_bytes(stub, "kid") == log_bytes(stub, "p")


@pytest.mark.parametrize("at_seq", [4, 5, 1 << 40])
def test_fork_past_the_end(stub: Stub, at_seq: int) -> None:
    """A cut past the parent's last event is BOUNDARY_OUT_OF_RANGE; nothing is created."""
    append(stub, "p", say("a"), say("b"), say("c"), say("d"))
    before = snapshot(stub, "p")
    error = fork_error(stub, "p", at_seq, "kid")
    check(error, INVALID, "BOUNDARY_OUT_OF_RANGE", at_seq=at_seq, next_seq=4)
    assert snapshot(stub, "p") == before
    assert session_ids(stub) == ["p"]


@pytest.mark.parametrize("at_seq", [None, 0, 3])
def test_fork_of_a_never_written_parent(stub: Stub, at_seq: int | None) -> None:
    """A parent that was never written has no boundary to cut at: BOUNDARY_OUT_OF_RANGE."""
    error = fork_error(stub, "ghost", at_seq, "kid")
    check(error, INVALID, "BOUNDARY_OUT_OF_RANGE", next_seq=0)
    assert session_ids(stub) == []


def test_fork_of_an_empty_session(stub: Stub) -> None:
    """A session created with no events has no seq to cut at either."""
    stub.CreateSession(pb.CreateSessionRequest(session_id="empty"))
    check(fork_error(stub, "empty", None, "kid"), INVALID, "BOUNDARY_OUT_OF_RANGE", next_seq=0)
    check(fork_error(stub, "empty", 0, "kid"), INVALID, "BOUNDARY_OUT_OF_RANGE", next_seq=0)
    assert session_ids(stub) == ["empty"]


# -- child ids ----------------------------------------------------------------------------------


def test_generated_child_ids_are_valid_and_unique(stub: Stub) -> None:
    """Without a child id the server picks a fresh, valid session id for each fork."""
    append(stub, "p", say("a"), say("b"))
    children = [fork(stub, "p", n % 2).session_id for n in range(6)]
    assert len(set(children)) == 6
    assert "p" not in children
    for n, child in enumerate(children):
        assert get(stub, child).parent_session_id == "p"
        reply = append(stub, child, say("own"))
        assert [e.seq for e in reply.events] == [n % 2 + 1]
    assert sorted(session_ids(stub)) == sorted(["p", *children])


def test_given_child_id_is_used(stub: Stub) -> None:
    """A given child id names the new session."""
    append(stub, "p", say("a"))
    assert fork(stub, "p", 0, "my-kid").session_id == "my-kid"
    assert get(stub, "my-kid").exists


@pytest.mark.parametrize("child", ["taken", "p"])
def test_fork_into_an_existing_session(stub: Stub, child: str) -> None:
    """A child id that exists (even the parent's own) is SESSION_ALREADY_EXISTS; both unchanged."""
    append(stub, "p", say("a"), say("b"))
    append(stub, "taken", say("mine"))
    before = snapshot(stub, "p"), snapshot(stub, "taken")
    error = fork_error(stub, "p", 0, child)
    check(error, grpc.StatusCode.ALREADY_EXISTS, "SESSION_ALREADY_EXISTS", session_id=child)
    assert (snapshot(stub, "p"), snapshot(stub, "taken")) == before


@pytest.mark.parametrize(("parent", "child"), [("bad id", "kid"), ("p", "bad id"), ("p", "-x")])
def test_fork_with_an_invalid_id(stub: Stub, parent: str, child: str) -> None:
    """An invalid parent or child id is INVALID_SESSION_ID; nothing is created."""
    append(stub, "p", say("a"))
    check(fork_error(stub, parent, 0, child), INVALID, "INVALID_SESSION_ID")
    assert session_ids(stub) == ["p"]


# -- what the child holds -----------------------------------------------------------------------


def test_fork_keeps_times_and_data(stub: Stub) -> None:
    """Copied events keep their seq, their time to the nanosecond and their data."""
    sent = [say("a"), ev(USER, content="b", extra={"k": [1, None, "x"]}), say("c", ASSISTANT)]
    sent[0].time.FromNanoseconds(1_700_000_000_123_456_789)
    append(stub, "p", *sent)
    time.sleep(0.01)
    fork(stub, "p", 1, "kid")
    parent = [event_pb2.Event.FromString(raw) for raw in log_bytes(stub, "p")]
    child = [event_pb2.Event.FromString(raw) for raw in log_bytes(stub, "kid")]
    assert child == parent[:2]
    assert child[0].time.ToNanoseconds() == 1_700_000_000_123_456_789


def test_fork_of_a_compacted_log(stub: Stub) -> None:
    """A fork of a log with replaces derives exactly the parent's view at that seq."""
    events = [
        say("sys", SYSTEM),
        say("a"),
        say("b", ASSISTANT),
        replace(1, 2, "sum-ab"),
        say("c"),
        say("d", ASSISTANT),
        replace(0, 5, "sum-all"),
        say("e"),
        replace(4, 4, "c-pruned"),
    ]
    append(stub, "p", *events)
    for at in range(len(events)):
        child = f"kid-{at}"
        session = fork(stub, "p", at, child)
        replaces = sum(1 for e in events[: at + 1] if e.surface_op.HasField("replace"))
        assert session.replace_generation == replaces
        assert get(stub, child).replace_generation == replaces
        surface_at = stub.Surface(pb.SurfaceRequest(session_id="p", at_seq=at))
        surface_child = stub.Surface(pb.SurfaceRequest(session_id=child))
        assert surface_child.SerializeToString() == surface_at.SerializeToString(), at
        derived_at = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id="p", at_seq=at))
        derived_child = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id=child))
        assert derived_child.SerializeToString() == derived_at.SerializeToString(), at
    full = stub.Surface(pb.SurfaceRequest(session_id="kid-8"))
    assert [e.data["content"] for e in full.events] == ["sum-all", "c-pruned", "e"]


def test_appending_to_the_child_leaves_the_parent(stub: Stub) -> None:
    """The child continues from at_seq + 1; the parent's log and views do not change."""
    append(stub, "p", say("a"), say("b", ASSISTANT), say("c"))
    fork(stub, "p", 2, "kid")
    before = snapshot(stub, "p")
    reply = append(stub, "kid", say("d", ASSISTANT), replace(0, 3, "all"))
    assert [e.seq for e in reply.events] == [3, 4]
    assert snapshot(stub, "p") == before
    assert get(stub, "kid").event_count == 5
    assert get(stub, "kid").parent_event_count == 3
    assert get(stub, "p").event_count == 3


def test_rewind_then_diverge(stub: Stub) -> None:
    """Rewind = fork at an earlier seq; the child then takes another path than the parent."""
    append(stub, "p", say("hi"), say("hello", ASSISTANT), say("tell a joke"), say("no", ASSISTANT))
    before = snapshot(stub, "p")
    fork(stub, "p", 1, "retry")
    reply = append(stub, "retry", say("tell a story"), expected_seq=2)
    assert [e.seq for e in reply.events] == [2]
    child = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id="retry"))
    parent = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id="p"))
    assert [m.content for m in child.messages] == ["hi", "hello", "tell a story"]
    assert [m.content for m in parent.messages] == ["hi", "hello", "tell a joke", "no"]
    assert list(child.messages[:2]) == list(parent.messages[:2])
    assert snapshot(stub, "p") == before


def test_fork_of_a_fork_names_its_own_parent(stub: Stub) -> None:
    """A grandchild records the fork it was copied from, not the original."""
    append(stub, "p", say("a"), say("b"), say("c"))
    fork(stub, "p", 2, "kid")
    append(stub, "kid", say("d"))
    grandchild = fork(stub, "kid", 3, "grandkid")
    assert (grandchild.parent_session_id, grandchild.parent_event_count) == ("kid", 4)
    assert log_bytes(stub, "grandkid") == log_bytes(stub, "kid")
