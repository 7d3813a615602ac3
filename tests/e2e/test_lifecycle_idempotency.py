"""request_id on CreateSession, SeedSession and ForkSession end to end (issue 17, part 8).

A retry after a lost reply is the same call sent twice with the same request_id: it gets the
first call's result (not SESSION_ALREADY_EXISTS, not a second fork child) and writes nothing; a
different request under the same request_id fails REQUEST_ID_REUSED and writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from sessionlog.testing import RunningServer
from sessionlog.v1 import message_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import ASSISTANT, Stub, check, failure, log_bytes, say, stats
from tests.e2e._proc import running_server

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXISTS = grpc.StatusCode.ALREADY_EXISTS


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("lifecycle") / "data") as running:
        yield running


@pytest.fixture
def stub(module_server: RunningServer) -> Stub:
    return module_server.stub()


Role = message_pb2.Role
NOBODY = message_pb2.Message(role=Role.ROLE_UNSPECIFIED, content="dropped")


def head(server: RunningServer) -> int:
    """The change feed's newest position: a write that replays must not move it."""
    return stats(server.channel()).position


def messages(*texts: str) -> list[message_pb2.Message]:
    return [message_pb2.Message(role=Role.ROLE_USER, content=text) for text in texts]


# -- CreateSession ------------------------------------------------------------------------------


def test_create_retry_returns_the_first_result(stub: Stub, module_server: RunningServer) -> None:
    sent = pb.CreateSessionRequest(
        session_id="c1", events=[say("a"), say("b", ASSISTANT)], request_id="create-1"
    )
    first = stub.CreateSession(sent)
    assert [e.seq for e in first.events] == [0, 1]
    position = head(module_server)
    again = stub.CreateSession(sent)
    assert again.SerializeToString() == first.SerializeToString()
    assert head(module_server) == position
    assert len(log_bytes(stub, "c1")) == 2


def test_create_without_request_id_still_refuses_an_existing_session(stub: Stub) -> None:
    stub.CreateSession(pb.CreateSessionRequest(session_id="c2", events=[say("a")]))
    error = failure(stub.CreateSession, pb.CreateSessionRequest(session_id="c2"))
    check(error, EXISTS, "SESSION_ALREADY_EXISTS", session_id="c2")


def test_create_with_a_new_request_id_on_an_existing_session_is_refused(stub: Stub) -> None:
    stub.CreateSession(pb.CreateSessionRequest(session_id="c3", request_id="r-a"))
    error = failure(stub.CreateSession, pb.CreateSessionRequest(session_id="c3", request_id="r-b"))
    check(error, EXISTS, "SESSION_ALREADY_EXISTS", session_id="c3")


def test_create_reused_request_id_with_other_events_fails(
    stub: Stub, module_server: RunningServer
) -> None:
    stub.CreateSession(
        pb.CreateSessionRequest(session_id="c4", events=[say("a")], request_id="create-4")
    )
    position = head(module_server)
    other = pb.CreateSessionRequest(session_id="c4", events=[say("z")], request_id="create-4")
    check(failure(stub.CreateSession, other), INVALID, "REQUEST_ID_REUSED", request_id="create-4")
    assert head(module_server) == position


def test_an_append_cannot_replay_a_create(stub: Stub) -> None:
    """Same events, same request_id, but an Append is not the CreateSession that used it."""
    stub.CreateSession(
        pb.CreateSessionRequest(session_id="c5", events=[say("a")], request_id="shared")
    )
    append = pb.AppendRequest(session_id="c5", events=[say("a")], request_id="shared")
    check(failure(stub.Append, append), INVALID, "REQUEST_ID_REUSED")
    assert len(log_bytes(stub, "c5")) == 1


# -- SeedSession --------------------------------------------------------------------------------


def test_seed_retry_returns_the_first_result(stub: Stub, module_server: RunningServer) -> None:
    sent = pb.SeedSessionRequest(
        session_id="s1",
        messages=[*messages("hello", "again"), NOBODY],
        request_id="seed-1",
    )
    first = stub.SeedSession(sent)
    assert [d.index for d in first.drops] == [2]
    position = head(module_server)
    again = stub.SeedSession(sent)
    assert again.SerializeToString() == first.SerializeToString()
    assert head(module_server) == position


def test_seed_reused_request_id_with_other_messages_fails(stub: Stub) -> None:
    stub.SeedSession(
        pb.SeedSessionRequest(session_id="s2", messages=messages("a"), request_id="seed-2")
    )
    other = pb.SeedSessionRequest(session_id="s2", messages=messages("b"), request_id="seed-2")
    check(failure(stub.SeedSession, other), INVALID, "REQUEST_ID_REUSED", request_id="seed-2")
    # A dropped message counts too: the kept events alone are the same.
    dropped = pb.SeedSessionRequest(
        session_id="s2",
        messages=[*messages("a"), NOBODY],
        request_id="seed-2",
    )
    check(failure(stub.SeedSession, dropped), INVALID, "REQUEST_ID_REUSED")


# -- ForkSession --------------------------------------------------------------------------------


def test_fork_with_a_generated_id_retried_makes_one_child(
    stub: Stub, module_server: RunningServer
) -> None:
    stub.CreateSession(pb.CreateSessionRequest(session_id="p1", events=[say("a"), say("b")]))
    sent = pb.ForkSessionRequest(parent_session_id="p1", at_seq=0, request_id="fork-1")
    first = stub.ForkSession(sent)
    child = first.session.session_id
    assert child.startswith("fork-")
    position = head(module_server)
    again = stub.ForkSession(sent)
    assert again.session.session_id == child
    assert again.SerializeToString() == first.SerializeToString()
    assert head(module_server) == position
    listed = stub.ListSessions(pb.ListSessionsRequest(page_size=1000)).sessions
    assert [s.session_id for s in listed if s.parent_session_id == "p1"] == [child]


def test_fork_with_a_named_child_retried_returns_it(stub: Stub) -> None:
    stub.CreateSession(pb.CreateSessionRequest(session_id="p2", events=[say("a")]))
    sent = pb.ForkSessionRequest(parent_session_id="p2", session_id="p2-kid", request_id="f")
    first = stub.ForkSession(sent)
    again = stub.ForkSession(sent)
    assert again.SerializeToString() == first.SerializeToString()
    # Without the request_id the same call is a second fork into an existing id.
    plain = pb.ForkSessionRequest(parent_session_id="p2", session_id="p2-kid")
    check(failure(stub.ForkSession, plain), EXISTS, "SESSION_ALREADY_EXISTS")


def test_fork_reused_request_id_fails(stub: Stub, module_server: RunningServer) -> None:
    stub.CreateSession(pb.CreateSessionRequest(session_id="p3", events=[say("a"), say("b")]))
    stub.ForkSession(pb.ForkSessionRequest(parent_session_id="p3", at_seq=0, request_id="f3"))
    position = head(module_server)
    other = pb.ForkSessionRequest(parent_session_id="p3", at_seq=1, request_id="f3")
    check(failure(stub.ForkSession, other), INVALID, "REQUEST_ID_REUSED", request_id="f3")
    # The parent's appends and its forks share one namespace of request ids.
    append = pb.AppendRequest(session_id="p3", events=[say("c")], request_id="f3")
    check(failure(stub.Append, append), INVALID, "REQUEST_ID_REUSED")
    assert head(module_server) == position


def test_fork_request_id_too_long_is_refused(stub: Stub) -> None:
    stub.CreateSession(pb.CreateSessionRequest(session_id="p4", events=[say("a")]))
    sent = pb.ForkSessionRequest(parent_session_id="p4", request_id="x" * 257)
    check(failure(stub.ForkSession, sent), INVALID, "INVALID_REQUEST_ID")
