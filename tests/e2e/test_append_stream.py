"""AppendStream end to end: pipelined appends, their order, their own errors, the window.

The module's server is shared (the ``sid`` fixture keeps tests apart); a test that needs other
settings (a small window, --ack replica) starts its own. Each request's Append semantics are
shown by test_append_stream_semantics.py; this module shows what the stream adds.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from sessionlog.shard import ShardMap
from sessionlog.testing import RunningServer
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog_client import AsyncClient, Client, SessionLogError, event
from sessionlog_client.errors import LeaseHeld, SeqConflict
from tests.e2e._helpers import Stub, check, log, stream_appends, user
from tests.e2e._proc import running_server

Sid = Callable[[str], str]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module's tests, each on its own sessions."""
    with running_server(tmp_path_factory.mktemp("append-stream") / "data") as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> Stub:
    return server.stub()


def chained(session_id: str, count: int, start: int = 0) -> list[pb.AppendRequest]:
    """``count`` one-event appends to a session, each naming the seq it must get."""
    return [
        pb.AppendRequest(session_id=session_id, events=[user(f"m{n}")], expected_seq=n)
        for n in range(start, start + count)
    ]


def interleaved(*chains: list[pb.AppendRequest]) -> list[pb.AppendRequest]:
    """The requests of several chains taken in turn (a, b, c, a, b, c, ...)."""
    return [request for round_ in zip(*chains, strict=True) for request in round_]


@pytest.mark.workers  # each stream's appends go to whichever worker takes it
def test_pipelined_appends_to_several_sessions_apply_in_stream_order(stub: Stub, sid: Sid) -> None:
    """600 appends to 3 sessions on one stream, each naming the seq it must get: every one is
    written at that seq (so each applied in stream order, though none waited for the one before),
    and the replies come back in request order with their correlation ids."""
    sessions = [sid(name) for name in "abc"]
    requests = interleaved(*(chained(s, 200) for s in sessions))
    replies = stream_appends(stub, requests)
    assert [r.correlation_id for r in replies] == list(range(1, 601))
    for request, reply in zip(requests, replies, strict=True):
        assert reply.WhichOneof("result") == "append", reply.error
        assert [e.seq for e in reply.append.events] == [request.expected_seq]
        assert reply.append.next_seq == request.expected_seq + 1
    for session_id in sessions:
        stored = log(stub, session_id)
        assert [e.seq for e in stored] == list(range(200))
        assert [e.data["content"] for e in stored] == [f"m{n}" for n in range(200)]


@pytest.mark.workers  # several streams, possibly on several workers, on the same sessions
def test_several_streams_on_shared_sessions_lose_and_repeat_nothing(
    server: RunningServer, sid: Sid
) -> None:
    """Four streams at once, each pipelining 100 appends to the same two sessions (no
    expected_seq): every acknowledged append is stored exactly once, each stream's own appends
    to a session hold increasing seqs in its stream order, and the seqs are dense."""
    sessions = [sid("x"), sid("y")]
    results: dict[int, list[pb.AppendStreamResponse]] = {}

    def run(writer: int) -> None:
        requests = [
            pb.AppendRequest(session_id=sessions[n % 2], events=[user(f"w{writer}-{n}")])
            for n in range(100)
        ]
        results[writer] = stream_appends(server.stub(), requests)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(results) == [0, 1, 2, 3]
    stub = server.stub()
    for index, session_id in enumerate(sessions):
        stored = {e.data["content"]: e.seq for e in log(stub, session_id)}
        assert sorted(stored.values()) == list(range(200))
        for writer, replies in results.items():
            mine = [r.append.events[0] for r in replies[index::2]]
            assert [e.data["content"] for e in mine] == [
                f"w{writer}-{n}" for n in range(index, 100, 2)
            ]
            assert [stored[e.data["content"]] for e in mine] == [e.seq for e in mine]
            assert [e.seq for e in mine] == sorted(e.seq for e in mine)


def test_a_refused_request_gets_its_own_error_and_the_stream_goes_on(stub: Stub, sid: Sid) -> None:
    """A seq conflict (with its metadata), a lease refusal, a malformed request and an invalid
    event each get their own error under their correlation id; the appends around them are
    written, and nothing of the refused ones."""
    session_id, leased = sid("s"), sid("leased")
    stub.AcquireLease(pb.AcquireLeaseRequest(session_id=leased, holder="w1"))
    bad = user("bad")
    bad.seq = 3
    sent = [
        pb.AppendStreamRequest(correlation_id=10, append=chained(session_id, 1)[0]),
        pb.AppendStreamRequest(correlation_id=11, append=chained(session_id, 1)[0]),
        pb.AppendStreamRequest(
            correlation_id=12, append=pb.AppendRequest(session_id=leased, events=[user()])
        ),
        pb.AppendStreamRequest(correlation_id=13),
        pb.AppendStreamRequest(
            correlation_id=14, append=pb.AppendRequest(session_id=session_id, events=[bad])
        ),
        pb.AppendStreamRequest(correlation_id=15, append=chained(session_id, 1, start=1)[0]),
    ]
    replies = list(stub.AppendStream(iter(sent), timeout=30))
    assert [r.correlation_id for r in replies] == [10, 11, 12, 13, 14, 15]
    outcome = [r.WhichOneof("result") for r in replies]
    assert outcome == ["append", "error", "error", "error", "error", "append"]
    conflict, lease, malformed, invalid = (r.error for r in replies[1:5])
    assert (conflict.code, conflict.reason) == (grpc.StatusCode.ABORTED.value[0], "SEQ_CONFLICT")
    assert dict(conflict.metadata) == {"next_seq": "1", "expected_seq": "0"}
    assert "expected" in conflict.message
    assert (lease.code, lease.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION.value[0],
        "LEASE_HELD",
    )
    assert lease.metadata["holder"] == "w1"
    assert (malformed.code, malformed.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
        "MALFORMED_REQUEST",
    )
    assert invalid.reason == "SEQ_ASSIGNED_BY_SERVER"
    assert [e.data["content"] for e in log(stub, session_id)] == ["m0", "m1"]
    assert log(stub, leased) == []


def test_an_undecodable_append_is_answered_under_its_correlation_id(
    server: RunningServer, sid: Sid
) -> None:
    """An append whose bytes do not decode is MALFORMED_REQUEST for that request alone (not
    INTERNAL, not the end of the stream)."""
    call = server.channel().stream_stream("/sessionlog.v1.SessionLogService/AppendStream")
    good = pb.AppendStreamRequest(
        correlation_id=2, append=pb.AppendRequest(session_id=sid("s"), events=[user()])
    ).SerializeToString()
    garbage = b"\x10\x01" + b"\x0a\x03\xff\xff\xff"  # correlation_id 1, an append of junk
    replies = [pb.AppendStreamResponse.FromString(r) for r in call(iter([garbage, good]))]
    assert [r.correlation_id for r in replies] == [1, 2]
    assert replies[0].error.reason == "MALFORMED_REQUEST"
    assert replies[0].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert replies[1].append.next_seq == 1


@pytest.mark.workers  # the request id table is shared by every worker
def test_a_retried_request_id_replays_on_the_stream(stub: Stub, sid: Sid) -> None:
    """The same request sent twice in one pipeline, and again on a later stream: every copy gets
    the first one's reply, and the events are written once."""
    session_id = sid("s")
    request = pb.AppendRequest(session_id=session_id, events=[user("once")], request_id="r-1")
    other = pb.AppendRequest(session_id=session_id, events=[user("between")])
    first, between, again = stream_appends(stub, [request, other, request])
    (later,) = stream_appends(stub, [request])
    assert first.append == again.append == later.append
    assert [e.seq for e in first.append.events] == [0]
    assert [e.seq for e in between.append.events] == [1]
    assert [e.data["content"] for e in log(stub, session_id)] == ["once", "between"]
    changed = pb.AppendRequest(session_id=session_id, events=[user("other")], request_id="r-1")
    (reused,) = stream_appends(stub, [changed])
    assert reused.error.reason == "REQUEST_ID_REUSED"


def test_a_lenient_request_reports_its_drops(stub: Stub, sid: Sid) -> None:
    """A lenient request's drops come back in its reply, as from unary Append."""
    bad = user("bad")
    bad.seq = 5
    lenient = pb.AppendRequest(session_id=sid("s"), events=[user("a"), bad], lenient=True)
    (reply,) = stream_appends(stub, [lenient])
    assert [(d.index, d.reason) for d in reply.append.drops] == [(1, "SEQ_ASSIGNED_BY_SERVER")]
    assert reply.append.next_seq == 1


def test_the_stream_ends_ok_once_the_client_is_done(stub: Stub, sid: Sid) -> None:
    """A stream the client half-closes right after its last request gets every reply, then
    status OK; an empty one ends OK at once."""
    sent = (
        pb.AppendStreamRequest(correlation_id=n, append=request)
        for n, request in enumerate(chained(sid("s"), 3))
    )
    call = stub.AppendStream(sent, timeout=10)
    assert [r.append.next_seq for r in call] == [1, 2, 3]
    assert call.code() == grpc.StatusCode.OK
    empty = stub.AppendStream(iter([]), timeout=10)
    assert list(empty) == []
    assert empty.code() == grpc.StatusCode.OK


def test_a_cancelled_stream_leaves_a_prefix_of_its_appends(server: RunningServer, sid: Sid) -> None:
    """A client that cancels with appends in flight: what the server had read is written in
    stream order with no hole (never a later append without an earlier one)."""
    session_id = sid("s")
    requests = [
        pb.AppendStreamRequest(
            correlation_id=n, append=pb.AppendRequest(session_id=session_id, events=[user(f"m{n}")])
        )
        for n in range(300)
    ]
    call = server.stub().AppendStream(iter(requests), timeout=30)
    for _ in range(10):
        next(call)
    call.cancel()
    time.sleep(0.5)  # let what the server had taken commit
    contents = [e.data["content"] for e in log(server.stub(), session_id)]
    assert len(contents) >= 10
    assert contents == [f"m{n}" for n in range(len(contents))]


def test_the_window_bounds_the_requests_in_flight(tmp_path: Path) -> None:
    """With --append-stream-window 4, while the first four requests wait for their
    acknowledgement (here: --ack replica and no replica), the server reads no fifth: four
    appends are written, not ten. Each then fails on its own (REPLICAS_UNAVAILABLE, the write
    kept), and the next four are read."""
    settings = {"append_stream_window": 4, "ack": "replica", "sync_timeout_seconds": 2.0}
    with running_server(tmp_path / "data", **settings) as held:
        stub = held.stub()
        requests = [pb.AppendRequest(session_id="w", events=[user(f"m{n}")]) for n in range(10)]
        replies: list[pb.AppendStreamResponse] = []
        reader = threading.Thread(target=lambda: replies.extend(stream_appends(stub, requests)))
        reader.start()
        time.sleep(1.0)
        assert len(log(stub, "w")) == 4
        assert replies == []
        reader.join(30)
        assert [r.error.reason for r in replies] == ["REPLICAS_UNAVAILABLE"] * 10
        assert len(log(stub, "w")) == 10


def test_shutdown_ends_an_open_stream_unavailable(tmp_path: Path) -> None:
    """A stream still open when the server stops gets its replies for what it sent, then
    UNAVAILABLE (a client resends what got no reply)."""
    with (
        running_server(tmp_path / "data") as stopping,
        grpc.insecure_channel(stopping.address) as channel,  # not closed by stop()
    ):
        outgoing: queue.Queue[pb.AppendStreamRequest | None] = queue.Queue()

        def requests() -> Iterator[pb.AppendStreamRequest]:
            while (request := outgoing.get()) is not None:
                yield request

        call = Stub(channel).AppendStream(requests(), timeout=30)  # type: ignore[no-untyped-call]
        outgoing.put(
            pb.AppendStreamRequest(
                correlation_id=1, append=pb.AppendRequest(session_id="s", events=[user()])
            )
        )
        assert next(call).append.next_seq == 1
        stopper = threading.Thread(target=stopping.stop, kwargs={"grace": 5.0})
        stopper.start()
        with pytest.raises(grpc.RpcError) as caught:
            next(call)
        outgoing.put(None)
        stopper.join(30)
    check(caught.value, grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE")


# -- the Python client ----------------------------------------------------------------------------


@pytest.mark.workers  # the client's stream lands on whichever worker takes it
def test_the_async_client_pipelines_and_raises_each_appends_own_error(
    server: RunningServer, sid: Sid
) -> None:
    """AsyncClient.append_stream: 100 appends sent before any reply is awaited, each future
    yields what append() returns; a conflicting one raises SeqConflict (with next_seq), as
    append() would, and the ones after it still land."""
    session_id = sid("s")

    async def scenario() -> tuple[list[int], SeqConflict, int]:
        async with AsyncClient(server.address) as client, client.append_stream() as stream:
            sent = [
                stream.append_nowait(session_id, [event("user_message", {"content": f"m{n}"})])
                for n in range(100)
            ]
            clash = stream.append_nowait(
                session_id, [event("user_message", {"content": "x"})], expected_seq=3
            )
            after = stream.append_nowait(
                session_id, [event("user_message", {"content": "y"})], expected_seq=100
            )
            seqs = [(await future).events[0].seq for future in sent]
            with pytest.raises(SeqConflict) as caught:
                await clash
            return seqs, caught.value, (await after).next_seq

    seqs, conflict, last = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert seqs == list(range(100))
    assert conflict.metadata["next_seq"] == "100"
    assert last == 101


def test_the_blocking_client_pipelines_with_concurrent_futures(
    server: RunningServer, sid: Sid
) -> None:
    """Client.append_stream: append_nowait returns concurrent futures, resolved in order once
    the stream is closed at the end of ``with``; a lease refusal raises LeaseHeld."""
    session_id, leased = sid("s"), sid("leased")
    with Client(server.address) as client:
        client.acquire_lease(leased, "w1")
        with client.append_stream() as stream:
            futures = [
                stream.append_nowait(session_id, [event("user_message", {"content": f"m{n}"})])
                for n in range(50)
            ]
            refused = stream.append_nowait(leased, [event("user_message", {"content": "x"})])
        assert [f.result().next_seq for f in futures] == list(range(1, 51))
        with pytest.raises(LeaseHeld):
            refused.result()
        assert list(client.since(leased)) == []


def test_the_clients_learn_the_epoch_from_the_streams_headers(
    server: RunningServer, stub: Stub, sid: Sid
) -> None:
    """A client whose only writes went over an AppendStream knows the server's epoch (from the
    stream's initial metadata), blocking and asyncio alike, and sends it with its next write."""
    _, unary = stub.Append.with_call(pb.AppendRequest(session_id=sid("s"), events=[user()]))
    epoch = int(dict(unary.trailing_metadata())["sessionlog-epoch"])
    with Client(server.address) as client:
        assert client.epoch == 0
        with client.append_stream() as stream:
            stream.append_nowait(sid("blocking"), [event("user_message", {"content": "x"})])
        assert client.epoch == epoch

    async def streamed_only() -> int:
        async with AsyncClient(server.address) as client, client.append_stream() as stream:
            await stream.append_nowait(sid("async"), [event("user_message", {"content": "x"})])
            return client.epoch

    assert asyncio.run(asyncio.wait_for(streamed_only(), 30)) == epoch


def test_the_client_fails_unanswered_appends_when_the_server_stops(tmp_path: Path) -> None:
    """A stream cut by shutdown: what was answered stands; a later append_nowait fails with
    Unavailable at once (nothing is resent by itself)."""
    with running_server(tmp_path / "data") as stopping, Client(stopping.address) as client:
        stream = client.append_stream()
        stream.open()
        first = stream.append_nowait("s", [event("user_message", {"content": "a"})])
        assert first.result(10).next_seq == 1
        stopping.stop(grace=5.0)
        deadline = time.monotonic() + 10
        late = stream.append_nowait("s", [event("user_message", {"content": "b"})])
        while not late.done() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(SessionLogError):
            late.result(0)
        stream.cancel()


# -- a replica, a sharded server ------------------------------------------------------------------


def test_a_replica_refuses_each_request_not_primary(tmp_path: Path) -> None:
    """On a read replica every request is refused NOT_PRIMARY naming the primary, one reply
    each, and the replica's log stays as the primary's."""
    with (
        running_server(tmp_path / "primary") as primary,
        running_server(tmp_path / "replica", replica_of=primary.address) as replica,
    ):
        requests = [pb.AppendRequest(session_id="r", events=[user()]) for _ in range(3)]
        replies = stream_appends(replica.stub(), requests)
        assert [r.error.reason for r in replies] == ["NOT_PRIMARY"] * 3
        assert {r.error.metadata["primary"] for r in replies} == {primary.address}
        assert log(primary.stub(), "r") == []


@pytest.mark.workers  # whichever worker takes the stream names the same epoch
def test_the_stream_names_the_epoch_and_refuses_a_caller_of_a_newer_one(
    stub: Stub, sid: Sid
) -> None:
    """The stream's initial metadata, before any reply, and its trailers carry the server's
    epoch (what a unary Append's trailers say); a stream whose caller has seen a newer epoch
    (request metadata ``sessionlog-epoch``) gets each append refused NOT_PRIMARY with the
    server's epoch, and nothing is written."""
    session = sid("epoch")
    append = pb.AppendRequest(session_id=session, events=[user()])
    _, unary = stub.Append.with_call(append, timeout=10)
    epoch = dict(unary.trailing_metadata())["sessionlog-epoch"]
    assert int(epoch) >= 1
    release = threading.Event()

    def held() -> Iterator[pb.AppendStreamRequest]:
        release.wait(10)  # nothing is sent before the initial metadata is read
        yield pb.AppendStreamRequest(correlation_id=1, append=append)

    call = stub.AppendStream(held(), timeout=30)
    assert dict(call.initial_metadata())["sessionlog-epoch"] == epoch
    release.set()
    assert [r.append.next_seq for r in call] == [2]
    assert dict(call.trailing_metadata())["sessionlog-epoch"] == epoch
    newer = (("sessionlog-epoch", str(int(epoch) + 1)),)
    replies = stream_appends(stub, [append, append], metadata=newer)
    assert [r.error.reason for r in replies] == ["NOT_PRIMARY"] * 2
    assert {r.error.metadata["epoch"] for r in replies} == {epoch}
    assert len(log(stub, session)) == 2


def test_a_sharded_server_refuses_another_groups_session_per_request(tmp_path: Path) -> None:
    """A sharded server answers a request for a session another group owns with WRONG_GROUP
    (naming the owner) and writes its own group's sessions on the same stream."""
    shard_map = ShardMap.even_split({"g1": ["127.0.0.1:1"], "g2": ["127.0.0.1:2"]}, epoch=1)
    path = tmp_path / "shards.toml"
    path.write_text(shard_map.to_toml())
    mine = next(f"s{n}" for n in range(200) if shard_map.owner(f"s{n}").name == "g1")
    theirs = next(f"s{n}" for n in range(200) if shard_map.owner(f"s{n}").name == "g2")
    with running_server(tmp_path / "data", shard_map=str(path), group="g1") as sharded:
        requests = [pb.AppendRequest(session_id=s, events=[user()]) for s in (mine, theirs, mine)]
        first, refused, last = stream_appends(sharded.stub(), requests)
        assert (first.append.next_seq, last.append.next_seq) == (1, 2)
        assert refused.error.reason == "WRONG_GROUP"
        assert refused.error.metadata["group"] == "g2"


def test_an_exception_in_the_async_block_cancels_the_stream(
    server: RunningServer, sid: Sid
) -> None:
    """Leaving ``async with`` by an exception cancels the call: the futures still unanswered
    fail (a SessionLogError) instead of being waited for; a stream whose appends were all
    answered ends too; no task is left behind either way."""
    session_id = sid("s")
    line = [event("user_message", {"content": "x"})]

    async def scenario() -> tuple[list[BaseException], int]:
        async with asyncio.timeout(30), AsyncClient(server.address) as client:
            with contextlib.suppress(KeyError):
                async with client.append_stream() as busy:
                    pending = [busy.append_nowait(session_id, line) for _ in range(200)]
                    raise KeyError("the caller's own failure")
            with contextlib.suppress(KeyError):
                async with client.append_stream() as idle:
                    for future in [idle.append_nowait(session_id, line) for _ in range(3)]:
                        await future
                    raise KeyError("the caller's own failure")
            outcomes = await asyncio.gather(*pending, return_exceptions=True)
            await asyncio.sleep(0.2)
            left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            return [o for o in outcomes if isinstance(o, BaseException)], len(left)

    failed, tasks_left = asyncio.run(scenario())
    assert tasks_left == 0
    assert failed, "some appends were still unanswered when the block was left"
    assert all(isinstance(o, SessionLogError) for o in failed)
    assert 3 <= len(log(server.stub(), session_id)) <= 203


def test_cancelling_a_blocking_stream_ends_its_threads(server: RunningServer, sid: Sid) -> None:
    """A blocking stream cancelled while idle (every append answered) ends its reader thread
    at once: nothing waits on the call afterwards."""
    with Client(server.address) as client:
        stream = client.append_stream()
        stream.open()
        answered = stream.append_nowait(sid("s"), [event("user_message", {"content": "x"})])
        assert answered.result(10).next_seq == 1
        stream.cancel()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
            t.name == "sessionlog-append-stream" for t in threading.enumerate()
        ):
            time.sleep(0.02)
        assert not [t for t in threading.enumerate() if t.name == "sessionlog-append-stream"]


def test_open_append_streams_count_against_max_streams(tmp_path: Path) -> None:
    """Each open AppendStream holds up to its window of requests in memory, so --max-streams
    bounds them as it bounds Since and Changes: with a limit of 2 and two streams open, a third
    is refused TOO_MANY_STREAMS and writes nothing; once one ends, a new one is served."""
    with running_server(tmp_path / "data", max_streams=2) as limited:
        stub = limited.stub()
        held: list[queue.Queue[pb.AppendStreamRequest | None]] = [queue.Queue(), queue.Queue()]

        def requests(
            outgoing: queue.Queue[pb.AppendStreamRequest | None],
        ) -> Iterator[pb.AppendStreamRequest]:
            while (request := outgoing.get()) is not None:
                yield request

        calls = [stub.AppendStream(requests(q), timeout=30) for q in held]
        for number, (outgoing, call) in enumerate(zip(held, calls, strict=True)):
            outgoing.put(pb.AppendStreamRequest(append=pb.AppendRequest(session_id=f"h{number}")))
            assert next(call).WhichOneof("result") == "append"
        with pytest.raises(grpc.RpcError) as caught:
            stream_appends(stub, [pb.AppendRequest(session_id="third", events=[user()])])
        check(caught.value, grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")
        held[0].put(None)
        assert list(calls[0]) == []
        assert log(stub, "third") == []  # (a Since stream: counted too)
        replies = stream_appends(stub, [pb.AppendRequest(session_id="third", events=[user()])])
        assert replies[0].append.next_seq == 1
        held[1].put(None)
