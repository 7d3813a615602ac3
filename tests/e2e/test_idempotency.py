"""Append's request_id end to end: a retry replays the first result and writes nothing (SPEC §7).

The replay window (request_id_ttl_seconds) is not configurable through running_server; it is
covered against the Store in tests/integration. The tests share one server, each on its own
sessions (the ``sid`` fixture); the restart test starts its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog.testing import RunningServer
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import ASSISTANT, Stub, check, log_bytes, say
from tests.e2e._proc import running_server

ET = event_pb2.EventType

INVALID = grpc.StatusCode.INVALID_ARGUMENT

Sid = Callable[[str], str]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module's tests (each writes its own sessions)."""
    with running_server(tmp_path_factory.mktemp("idempotency") / "data") as running:
        yield running


# -- helpers ------------------------------------------------------------------------------------


def request(session_id: str, *events: event_pb2.Event, **fields: Any) -> pb.AppendRequest:
    return pb.AppendRequest(session_id=session_id, events=events, **fields)


def failure(stub: Stub, sent: pb.AppendRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        stub.Append(sent)
    return caught.value


# -- replays ------------------------------------------------------------------------------------


def test_retry_returns_the_identical_response(stub: Stub, sid: Sid) -> None:
    """A retried request_id gets the first response byte for byte and writes nothing, even after
    other appends moved the log on."""
    stub.Append(request(sid("s"), say("zero")))
    sent = request(sid("s"), say("a"), say("b", ASSISTANT), request_id="req-1")
    first = stub.Append(sent)
    assert [e.seq for e in first.events] == [1, 2]
    log = log_bytes(stub, sid("s"))
    again = stub.Append(sent)
    assert again.SerializeToString() == first.SerializeToString()
    assert log_bytes(stub, sid("s")) == log

    stub.Append(request(sid("s"), say("later")))
    log = log_bytes(stub, sid("s"))
    late = stub.Append(sent)
    assert late.SerializeToString() == first.SerializeToString()
    assert late.next_seq == 3
    assert log_bytes(stub, sid("s")) == log


def test_retry_of_a_first_append_replays(stub: Stub, sid: Sid) -> None:
    """The append that created the session replays too, with the server-stamped times it got."""
    sent = request(sid("s"), say("a"), request_id="create-1")
    first = stub.Append(sent)
    again = stub.Append(sent)
    assert again == first
    assert len(log_bytes(stub, sid("s"))) == 1


def test_retry_of_a_lenient_append_replays_its_drops(stub: Stub, sid: Sid) -> None:
    """A lenient append's drops come back unchanged on a retry."""
    bad = event_pb2.Event(type=ET.EVENT_TYPE_UNSPECIFIED)
    sent = request(sid("s"), say("a"), bad, say("b"), request_id="req-1", lenient=True)
    first = stub.Append(sent)
    assert [(d.index, d.reason) for d in first.drops] == [(1, "UNKNOWN_EVENT_TYPE")]
    again = stub.Append(sent)
    assert again.SerializeToString() == first.SerializeToString()
    assert len(log_bytes(stub, sid("s"))) == 2


def test_no_request_id_means_no_deduplication(stub: Stub, sid: Sid) -> None:
    """Without a request_id, the same append twice writes twice."""
    stub.Append(request(sid("s"), say("a")))
    stub.Append(request(sid("s"), say("a")))
    assert len(log_bytes(stub, sid("s"))) == 2


def test_concurrent_retries_write_once(stub: Stub, sid: Sid) -> None:
    """Eight simultaneous sends of one request_id write its events once and all get one answer."""
    sent = request(sid("s"), say("a"), say("b"), request_id="req-1")
    workers = 8
    barrier = threading.Barrier(workers)
    replies: list[Any] = []

    def send() -> None:
        barrier.wait(10)
        try:
            replies.append(stub.Append(sent).SerializeToString())
        except grpc.RpcError as error:
            replies.append(error)

    threads = [threading.Thread(target=send) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(replies) == workers
    assert all(isinstance(r, bytes) for r in replies), replies
    assert len(set(replies)) == 1
    assert len(log_bytes(stub, sid("s"))) == 2


# -- REQUEST_ID_REUSED --------------------------------------------------------------------------


def _with_time(content: str) -> event_pb2.Event:
    made = say(content)
    made.time.FromNanoseconds(1_700_000_000_000_000_001)
    return made


@pytest.mark.parametrize(
    ("events", "fields"),
    [
        ([say("other")], {}),
        ([say("a"), say("b")], {}),
        ([say("a", ASSISTANT)], {}),
        ([_with_time("a")], {}),
        ([say("a")], {"lenient": True}),
        ([], {}),
    ],
)
def test_same_id_other_events_is_refused(
    stub: Stub, sid: Sid, events: list[event_pb2.Event], fields: dict[str, Any]
) -> None:
    """Reusing a request_id with anything but the same events is REQUEST_ID_REUSED; no write."""
    stub.Append(request(sid("s"), say("a"), request_id="req-1"))
    log = log_bytes(stub, sid("s"))
    error = failure(stub, request(sid("s"), *events, request_id="req-1", **fields))
    check(error, INVALID, "REQUEST_ID_REUSED", request_id="req-1")
    assert log_bytes(stub, sid("s")) == log


def test_request_ids_are_per_session(stub: Stub, sid: Sid) -> None:
    """One request_id on two sessions is two requests: each writes its own events."""
    first = stub.Append(request(sid("s1"), say("one"), request_id="req-1"))
    second = stub.Append(request(sid("s2"), say("two"), say("three"), request_id="req-1"))
    assert [e.seq for e in first.events] == [0]
    assert [e.seq for e in second.events] == [0, 1]
    assert len(log_bytes(stub, sid("s1"))) == 1
    assert len(log_bytes(stub, sid("s2"))) == 2
    assert stub.Append(request(sid("s1"), say("one"), request_id="req-1")) == first


# -- failed appends are not remembered ----------------------------------------------------------


def test_failed_seq_conflict_is_not_remembered(stub: Stub, sid: Sid) -> None:
    """An append refused for SEQ_CONFLICT leaves its request_id free for the corrected retry."""
    stub.Append(request(sid("s"), say("zero")))
    error = failure(stub, request(sid("s"), say("a"), request_id="req-1", expected_seq=0))
    check(error, grpc.StatusCode.ABORTED, "SEQ_CONFLICT", next_seq=1)
    fixed = request(sid("s"), say("a"), request_id="req-1", expected_seq=1)
    first = stub.Append(fixed)
    assert [e.seq for e in first.events] == [1]
    assert stub.Append(fixed) == first
    assert len(log_bytes(stub, sid("s"))) == 2


def test_failed_validation_is_not_remembered(stub: Stub, sid: Sid) -> None:
    """An append refused for an invalid event does not claim its request_id."""
    bad = event_pb2.Event(type=ET.EVENT_TYPE_UNSPECIFIED)
    check(failure(stub, request(sid("s"), bad, request_id="req-1")), INVALID, "UNKNOWN_EVENT_TYPE")
    stub.Append(request(sid("s"), say("zero")))
    check(failure(stub, request(sid("s"), bad, request_id="req-1")), INVALID, "UNKNOWN_EVENT_TYPE")
    reply = stub.Append(request(sid("s"), say("good"), request_id="req-1"))
    assert [e.seq for e in reply.events] == [1]


def test_replay_beats_a_lease_taken_since(stub: Stub, sid: Sid) -> None:
    """A retry of an append that succeeded replays even after someone took the lease (SPEC §3:
    the replay is checked before the lease)."""
    sent = request(sid("s"), say("a"), request_id="req-1")
    first = stub.Append(sent)
    stub.AcquireLease(pb.AcquireLeaseRequest(session_id=sid("s"), holder="w1"))
    assert stub.Append(sent) == first
    check(
        failure(stub, request(sid("s"), say("a"), request_id="req-2")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "LEASE_HELD",
    )
    assert len(log_bytes(stub, sid("s"))) == 1


# -- request id length --------------------------------------------------------------------------


@pytest.mark.parametrize("request_id", ["r" * 257, "é" * 129, "x" * 10_000])
def test_request_id_over_256_bytes(stub: Stub, sid: Sid, request_id: str) -> None:
    """A request_id over 256 bytes (UTF-8) is INVALID_REQUEST_ID and writes nothing."""
    stub.Append(request(sid("s"), say("zero")))
    error = failure(stub, request(sid("s"), say("a"), request_id=request_id))
    check(error, INVALID, "INVALID_REQUEST_ID", limit=256)
    assert request_id not in error.details()
    assert len(log_bytes(stub, sid("s"))) == 1


def test_request_id_of_256_bytes(stub: Stub, sid: Sid) -> None:
    """A 256-byte request_id (multi-byte characters included) works and replays."""
    request_id = "é" * 128
    sent = request(sid("s"), say("a"), request_id=request_id)
    first = stub.Append(sent)
    assert stub.Append(sent) == first
    assert len(log_bytes(stub, sid("s"))) == 1


# -- restarts -----------------------------------------------------------------------------------


def test_replay_after_a_restart(tmp_path: Path) -> None:
    """Request ids are durable: after a restart a retry still replays and a reuse is refused."""
    data = tmp_path / "data"
    sent = request("s", say("a"), say("b"), request_id="req-1")
    with running_server(data) as server:
        stub = server.stub()
        first = stub.Append(sent)
        stub.Append(request("s", say("c")))
        log = log_bytes(stub, "s")
    with running_server(data) as server:
        stub = server.stub()
        again = stub.Append(sent)
        assert again.SerializeToString() == first.SerializeToString()
        assert log_bytes(stub, "s") == log
        error = failure(stub, request("s", say("x"), request_id="req-1"))
        check(error, INVALID, "REQUEST_ID_REUSED")
        assert log_bytes(stub, "s") == log
