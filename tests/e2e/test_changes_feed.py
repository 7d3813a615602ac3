"""ReplicationService.Changes, the global change feed, over real gRPC (in-process server).

One record per committed command, position dense from 1, in commit order; resumable from any
position; with follow: the stored changes, one caught_up, then live changes, with heartbeats while
idle. Changes are read as raw bytes so "exactly as Since returns them" is a byte comparison.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from sessionlog import wire
from sessionlog.testing import RunningServer, error_info
from sessionlog.v1 import event_pb2, message_pb2
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import replication_service_pb2_grpc as rpb_grpc
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._proc import running_server
from tests.e2e._replication_cluster import changes_raw, event, positions, since_raw

pytestmark = pytest.mark.workers

APPEND, CREATE, FORK, LEASE = (
    rpb.CHANGE_KIND_APPEND,
    rpb.CHANGE_KIND_CREATE,
    rpb.CHANGE_KIND_FORK,
    rpb.CHANGE_KIND_LEASE,
)
USER = event_pb2.EVENT_TYPE_USER_MESSAGE
FEED_METHOD = "/sessionlog.v1.ReplicationService/Changes"


def users(*texts: str) -> list[event_pb2.Event]:
    return [event(USER, text) for text in texts]


def feed_stub(server: RunningServer) -> rpb_grpc.ReplicationServiceStub:
    return rpb_grpc.ReplicationServiceStub(server.channel())  # type: ignore[no-untyped-call]


def open_feed(server: RunningServer, start: int = 0, timeout: float = 30.0) -> Any:
    """A follow stream of the change feed yielding raw responses (with .cancel())."""
    call = server.channel().unary_stream(
        FEED_METHOD, request_serializer=rpb.ChangesRequest.SerializeToString
    )
    return call(rpb.ChangesRequest(start_position=start, follow=True), timeout=timeout)


def split(raw: bytes) -> tuple[rpb.ChangesResponse, list[bytes]]:
    """A raw ChangesResponse: its other fields, and its changes' raw bytes."""
    rest, changes = wire.split_field(raw, 1)
    return rpb.ChangesResponse.FromString(rest), changes


def read_until(stream: Iterator[bytes], position: int, limit: int = 10_000) -> list[Any]:
    """Responses until the change at ``position`` has arrived: (response, raw changes) pairs."""
    out: list[Any] = []
    for _ in range(limit):
        response, changes = split(next(stream))
        out.append((response, changes))
        if changes and rpb.Change.FromString(changes[-1]).position >= position:
            return out
    raise AssertionError(f"position {position} not reached in {limit} responses")


def change_events(raw_change: bytes) -> list[bytes]:
    return wire.split_field(raw_change, 9)[1]


def test_changes_list_every_kind_in_commit_order(server: RunningServer) -> None:
    """Without follow, Changes returns every committed change in order, dense from 1, with its
    kind, session, first_seq / event_count and the events exactly as Since returns them."""
    stub, minute = server.stub(), Duration(seconds=60)
    stub.Append(pb.AppendRequest(session_id="a", events=users("1", "2", "3")), timeout=10)
    stub.CreateSession(pb.CreateSessionRequest(session_id="b", events=users("x", "y")))
    messages = [message_pb2.Message(role=message_pb2.ROLE_USER, content=t) for t in "pq"]
    stub.SeedSession(pb.SeedSessionRequest(session_id="c", messages=messages), timeout=10)
    stub.Append(pb.AppendRequest(session_id="a", events=users("4", "5")), timeout=10)
    stub.ForkSession(pb.ForkSessionRequest(parent_session_id="a", at_seq=3, session_id="d"))
    stub.AcquireLease(pb.AcquireLeaseRequest(session_id="a", holder="w", ttl=minute))
    stub.RenewLease(pb.RenewLeaseRequest(session_id="a", holder="w", ttl=minute))
    stub.Append(pb.AppendRequest(session_id="a", events=users("6"), lease_holder="w"))
    stub.ReleaseLease(pb.ReleaseLeaseRequest(session_id="a", holder="w"))
    stub.CreateSession(pb.CreateSessionRequest(session_id="e"))
    expected = [
        (APPEND, "a", 0, 3),
        (CREATE, "b", 0, 2),
        (CREATE, "c", 0, 2),
        (APPEND, "a", 3, 2),
        (FORK, "d", 0, 4),
        (LEASE, "a", 0, 0),
        (LEASE, "a", 0, 0),
        (APPEND, "a", 5, 1),
        (LEASE, "a", 0, 0),
        (CREATE, "e", 0, 0),
    ]
    raw = changes_raw(server.channel())
    changes = [rpb.Change.FromString(c) for c in raw]
    assert [c.position for c in changes] == list(range(1, len(expected) + 1))
    assert [(c.kind, c.session_id, c.first_seq, c.event_count) for c in changes] == expected
    stamps = [c.commit_time.ToNanoseconds() for c in changes]
    assert all(stamps)
    assert stamps == sorted(stamps)
    for change, record in zip(changes, raw, strict=True):
        stored = since_raw(server.channel(), change.session_id)
        first, count = change.first_seq, change.event_count
        assert change_events(record) == stored[first : first + count], change.position
    assert len({c.internal_id for c in changes if c.session_id == "a" and c.event_count}) == 1
    assert since_raw(server.channel(), "d") == since_raw(server.channel(), "a")[:4]
    typed = [
        c for r in feed_stub(server).Changes(rpb.ChangesRequest(), timeout=10) for c in r.changes
    ]
    assert typed == changes


def test_start_position_resumes_exactly(server: RunningServer) -> None:
    """Reading from any start position returns exactly the tail of the full feed, across
    responses split by the batch byte budget; 0 and 1 both mean the beginning."""
    stub = server.stub()
    big = "z" * 1000
    for i in range(8):  # ~200 KB each: the 1 MiB batches split the feed over several responses
        stub.Append(pb.AppendRequest(session_id="big", events=users(*[big] * 200)), timeout=10)
        stub.Append(pb.AppendRequest(session_id=f"small{i % 3}", events=users("s")), timeout=10)
    full = changes_raw(server.channel())
    assert positions(full) == list(range(1, 17))
    responses = list(feed_stub(server).Changes(rpb.ChangesRequest(start_position=1), timeout=10))
    assert len(responses) > 1
    assert [c.position for r in responses for c in r.changes] == list(range(1, 17))
    for start in (0, 1, 2, 7, 8, 9, 15, 16):
        assert changes_raw(server.channel(), start) == full[max(start, 1) - 1 :], start
    assert changes_raw(server.channel(), 17) == []
    assert changes_raw(server.channel(), 1 << 40) == []


def test_follow_sends_stored_then_caught_up_then_live(server: RunningServer) -> None:
    """With follow: the stored changes, one caught_up carrying the head position, then the
    changes of 4 concurrent writers in commit order with no gap and no duplicate; a second
    follower opened while those writers run sees the same dense sequence."""
    stub = server.stub()
    for i in range(20):
        stub.Append(pb.AppendRequest(session_id=f"pre{i % 4}", events=users(str(i))), timeout=10)
    first = open_feed(server)
    stored: list[bytes] = []
    for _ in range(100):
        response, changes = split(next(first))
        stored.extend(changes)
        if response.caught_up:
            assert not changes
            assert response.head_position == 20
            assert response.head_commit_time.ToNanoseconds() > 0
            break
    assert positions(stored) == list(range(1, 21))

    per_writer, failures = 50, []
    second: Any = None

    def write(writer: int) -> None:
        try:
            writer_stub = server.stub()
            for n in range(per_writer):
                session_id = f"live{(writer + n) % 3}"
                writer_stub.Append(
                    pb.AppendRequest(session_id=session_id, events=users(f"{writer}-{n}")),
                    timeout=10,
                )
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=write, args=(w,), daemon=True) for w in range(4)]
    for thread in threads:
        thread.start()
    second = open_feed(server)  # races the writers: its catch-up and live phases overlap them
    head = 20 + 4 * per_writer
    live = read_until(first, head)
    racing = read_until(second, head)
    for thread in threads:
        thread.join(20)
    assert not failures, failures
    first.cancel()
    second.cancel()
    assert not any(response.caught_up for response, _ in live), "a second caught_up"
    live_changes = [c for _, changes in live for c in changes]
    assert positions(live_changes) == list(range(21, head + 1))
    assert live_changes == changes_raw(server.channel(), 21)
    marks = [i for i, (response, _) in enumerate(racing) if response.caught_up]
    assert len(marks) == 1
    before = [c for _, changes in racing[: marks[0]] for c in changes]
    assert racing[marks[0]][0].head_position >= len(before)
    assert [c for _, changes in racing for c in changes] == changes_raw(server.channel())


@pytest.mark.serial  # 3 heartbeats of 0.2 s within 0.3-2 s
def test_heartbeats_carry_head_position(tmp_path: Path) -> None:
    """An idle follow stream gets heartbeats (no changes, not caught_up) every heartbeat
    interval, each carrying the current head position and its commit time."""
    with running_server(tmp_path / "data", heartbeat_seconds=0.2) as server:
        stub = server.stub()
        stub.Append(pb.AppendRequest(session_id="s", events=users("a", "b")), timeout=10)
        stub.Append(pb.AppendRequest(session_id="t", events=users("c")), timeout=10)
        head_time = rpb.Change.FromString(changes_raw(server.channel())[-1]).commit_time
        stream = open_feed(server, timeout=20)
        responses = [split(next(stream)) for _ in range(2)]
        assert responses[-1][0].caught_up
        assert responses[-1][0].head_position == 2
        started = time.monotonic()
        beats = [split(next(stream)) for _ in range(3)]
        spent = time.monotonic() - started
        for response, changes in beats:
            assert (changes, response.caught_up, response.head_position) == ([], False, 2)
            assert response.head_commit_time == head_time
        assert 0.3 < spent < 2.0, f"3 heartbeats took {spent:.2f}s at a 0.2 s interval"
        stub.Append(pb.AppendRequest(session_id="s", events=users("d")), timeout=10)
        arrived = read_until(stream, 3)
        assert positions(arrived[-1][1]) == [3]
        response, changes = split(next(stream))
        assert (changes, response.caught_up, response.head_position) == ([], False, 3)
        stream.cancel()


def refused_and_empty_writes(server: RunningServer) -> list[str]:
    """Writes that must leave no change: refusals, a replay, empty and all-dropped appends, a
    release of no lease. Returns the names of the calls made."""
    stub = server.stub()
    made: list[str] = []

    def expect(name: str, code: grpc.StatusCode | None, call: Any) -> None:
        if code is None:
            call()
        else:
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == code, (name, caught.value.details())
            assert error_info(caught.value).domain == "sessionlog"
        made.append(name)

    invalid = event_pb2.Event(type=event_pb2.EVENT_TYPE_UNSPECIFIED)
    codes = grpc.StatusCode
    first = pb.AppendRequest(session_id="s", events=users("1", "2"), request_id="r1")
    expect(
        "bad type",
        codes.INVALID_ARGUMENT,
        lambda: stub.Append(pb.AppendRequest(session_id="s", events=[invalid])),
    )
    expect(
        "seq conflict",
        codes.ABORTED,
        lambda: stub.Append(pb.AppendRequest(session_id="s", events=users("x"), expected_seq=0)),
    )
    expect("replay", None, lambda: stub.Append(first))
    expect(
        "reused id",
        codes.INVALID_ARGUMENT,
        lambda: stub.Append(pb.AppendRequest(session_id="s", events=users("9"), request_id="r1")),
    )
    expect("empty", None, lambda: stub.Append(pb.AppendRequest(session_id="s")))
    expect("empty new", None, lambda: stub.Append(pb.AppendRequest(session_id="never")))
    expect(
        "all dropped",
        None,
        lambda: stub.Append(pb.AppendRequest(session_id="s", events=[invalid], lenient=True)),
    )
    expect(
        "lease held",
        codes.FAILED_PRECONDITION,
        lambda: stub.Append(pb.AppendRequest(session_id="held", events=users("x"))),
    )
    expect(
        "exists",
        codes.ALREADY_EXISTS,
        lambda: stub.CreateSession(pb.CreateSessionRequest(session_id="s")),
    )
    expect(
        "seed exists",
        codes.ALREADY_EXISTS,
        lambda: stub.SeedSession(pb.SeedSessionRequest(session_id="s")),
    )
    expect(
        "fork past end",
        codes.INVALID_ARGUMENT,
        lambda: stub.ForkSession(pb.ForkSessionRequest(parent_session_id="s", at_seq=99)),
    )
    expect(
        "fork onto existing",
        codes.ALREADY_EXISTS,
        lambda: stub.ForkSession(pb.ForkSessionRequest(parent_session_id="s", session_id="s")),
    )
    expect(
        "acquire held",
        codes.FAILED_PRECONDITION,
        lambda: stub.AcquireLease(pb.AcquireLeaseRequest(session_id="held", holder="other")),
    )
    expect(
        "renew not held",
        codes.FAILED_PRECONDITION,
        lambda: stub.RenewLease(pb.RenewLeaseRequest(session_id="held", holder="other")),
    )
    expect(
        "release none",
        None,
        lambda: stub.ReleaseLease(pb.ReleaseLeaseRequest(session_id="free", holder="x")),
    )
    return made


def test_refused_replayed_and_empty_writes_add_no_change(server: RunningServer) -> None:
    """Refused writes, an idempotent replay, empty and all-dropped appends and a release of no
    lease leave the feed untouched: a follower sees the next real write at head + 1."""
    stub = server.stub()
    stub.Append(pb.AppendRequest(session_id="s", events=users("1", "2"), request_id="r1"))
    stub.AcquireLease(pb.AcquireLeaseRequest(session_id="held", holder="w"))
    before = changes_raw(server.channel())
    assert positions(before) == [1, 2]
    stream = open_feed(server)
    assert read_until_caught_up(stream).head_position == 2
    made = refused_and_empty_writes(server)
    assert len(made) == 15
    assert changes_raw(server.channel()) == before
    status = feed_stub(server).GetReplicationStatus(rpb.GetReplicationStatusRequest())
    assert status.position == 2
    stub.Append(pb.AppendRequest(session_id="s", events=users("3")), timeout=10)
    arrived = read_until(stream, 3)
    assert [c for _, changes in arrived for c in changes] == changes_raw(server.channel(), 3)
    stream.cancel()


def read_until_caught_up(stream: Iterator[bytes], limit: int = 1000) -> rpb.ChangesResponse:
    for _ in range(limit):
        response, _ = split(next(stream))
        if response.caught_up:
            return response
    raise AssertionError("no caught_up")


def test_status_on_a_primary(server: RunningServer) -> None:
    """GetReplicationStatus on a primary says role primary and its head position, with every
    replica-only field left empty; an empty primary's feed is empty and caught up at 0."""
    feed = feed_stub(server)
    empty = feed.GetReplicationStatus(rpb.GetReplicationStatusRequest(), timeout=10)
    assert (empty.role, empty.position) == ("primary", 0)
    assert changes_raw(server.channel()) == []
    stream = open_feed(server)
    assert read_until_caught_up(stream).head_position == 0
    stream.cancel()
    for i in range(5):
        server.stub().Append(pb.AppendRequest(session_id=f"s{i}", events=users("x")), timeout=10)
    status = feed.GetReplicationStatus(rpb.GetReplicationStatusRequest(), timeout=10)
    assert status.role == "primary"
    assert status.position == 5
    assert status.primary == ""
    assert (status.primary_position, status.lag_positions) == (0, 0)
    assert (status.caught_up, status.connected) == (False, False)
    assert not status.HasField("last_contact_time")
