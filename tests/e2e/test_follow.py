"""Follow streams over real gRPC: stored events, one caught_up marker, then live events in order.

Every stream is opened with a deadline, so a stream that stops sending fails the test with
DEADLINE_EXCEEDED instead of hanging it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog.testing import RunningServer, ThreadedServer, error_info
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import user
from tests.e2e._proc import running_server

pytestmark = pytest.mark.workers


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the tests that only write and follow sessions of their own (in workers
    mode a server start costs seconds); the tests that count followers or stop the server have
    their own (``server``)."""
    with running_server(tmp_path_factory.mktemp("follow") / "data") as running:
        yield running


STREAM_DEADLINE = 30.0
Stream = Iterator[pb.SinceResponse]


def append(stub: pb_grpc.SessionLogServiceStub, session_id: str, *contents: str) -> list[int]:
    """Append one batch of user messages; the seqs they got."""
    reply = stub.Append(
        pb.AppendRequest(session_id=session_id, events=[user(c) for c in contents]), timeout=10
    )
    return [e.seq for e in reply.events]


def follow(stub: pb_grpc.SessionLogServiceStub, session_id: str, seq: int = 0) -> Any:
    """An open follow stream (iterator of SinceResponse, with .cancel())."""
    return stub.Since(
        pb.SinceRequest(session_id=session_id, seq=seq, follow=True), timeout=STREAM_DEADLINE
    )


def read_until_caught_up(
    stream: Stream, limit: int = 10_000
) -> tuple[list[event_pb2.Event], pb.SinceResponse]:
    """The stored events, and the caught_up response that ends them."""
    events: list[event_pb2.Event] = []
    for _ in range(limit):
        response = next(stream)
        events.extend(response.events)
        if response.caught_up:
            return events, response
    raise AssertionError(f"no caught_up response within {limit} responses")


def read_live(stream: Stream, count: int) -> list[event_pb2.Event]:
    """Exactly ``count`` more events; no response among them may claim caught_up again."""
    events: list[event_pb2.Event] = []
    for _ in range(count + 100):
        if len(events) >= count:
            break
        response = next(stream)
        assert not response.caught_up, "a second caught_up response"
        events.extend(response.events)
    assert len(events) == count, f"wanted {count} events, got {len(events)}"
    return events


def seqs(events: list[event_pb2.Event]) -> list[int]:
    return [e.seq for e in events]


def contents(events: list[event_pb2.Event]) -> list[str]:
    return [str(e.data["content"]) for e in events]


def number(event: event_pb2.Event, key: str) -> int:
    """An integer stored in event data (a Struct holds it as a float)."""
    value = event.data[key]
    assert isinstance(value, float), f"{key} is {value!r}"
    return int(value)


def follower_count(server: ThreadedServer) -> int:
    """The server's registered followers, read on its own event loop."""

    async def count() -> int:
        return server.server._notifier.follower_count

    result: int = server.run(count())
    return result


def test_stored_then_one_caught_up_then_live(shared: RunningServer) -> None:
    """Follow sends the stored events, one caught_up response with next_seq, then live events."""
    stub = shared.stub()
    append(stub, "s", "a", "b", "c")
    stream = follow(stub, "s")
    try:
        stored, marker = read_until_caught_up(stream)
        assert seqs(stored) == [0, 1, 2]
        assert contents(stored) == ["a", "b", "c"]
        assert marker.next_seq == 3
        append(stub, "s", "d")
        append(stub, "s", "e", "f")
        live = read_live(stream, 3)
        assert seqs(live) == [3, 4, 5]
        assert contents(live) == ["d", "e", "f"]
    finally:
        stream.cancel()


def test_concurrent_writers_seen_once_in_order(shared: RunningServer) -> None:
    """4 threads x 250 single-event appends reach two followers exactly once, in seq order."""
    writers, per_writer, total = 4, 250, 1000
    early = follow(shared.stub(), "busy")
    _, marker = read_until_caught_up(early)
    assert marker.next_seq == 0

    acked: dict[int, tuple[int, int]] = {}
    failures: list[BaseException] = []
    lock = threading.Lock()

    def write(writer: int) -> None:
        stub = shared.stub()
        try:
            for i in range(per_writer):
                [seq] = append_one(stub, writer, i)
                with lock:
                    acked[seq] = (writer, i)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(w,), daemon=True) for w in range(writers)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + STREAM_DEADLINE
    while len(acked) < 200 and not failures and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not failures, failures
    late = follow(shared.stub(), "busy")  # joins while writes are in flight
    try:
        early_events = read_live(early, total)
        late_events, late_markers = read_all_with_marker(late, total)
        for thread in threads:
            thread.join(STREAM_DEADLINE)
        assert not failures, failures
        assert len(acked) == total

        for events in (early_events, late_events):
            assert seqs(events) == list(range(total))
            origin = [(number(e, "writer"), number(e, "i")) for e in events]
            assert origin == [acked[s] for s in range(total)]
            for writer in range(writers):
                assert [i for w, i in origin if w == writer] == list(range(per_writer))
        [stored_before_marker] = late_markers  # exactly one caught_up
        assert stored_before_marker >= 200  # it joined mid-stream: stored first, then live
        stored = list(shared.stub().Since(pb.SinceRequest(session_id="busy"), timeout=10))
        assert sum(len(r.events) for r in stored) == total
    finally:
        early.cancel()
        late.cancel()


def append_one(stub: pb_grpc.SessionLogServiceStub, writer: int, i: int) -> list[int]:
    event = user(f"w{writer}-{i}", writer=writer, i=i)
    reply = stub.Append(pb.AppendRequest(session_id="busy", events=[event]), timeout=10)
    return [e.seq for e in reply.events]


def read_all_with_marker(stream: Stream, count: int) -> tuple[list[event_pb2.Event], list[int]]:
    """``count`` events from a follow stream, and how many events preceded each caught_up."""
    events: list[event_pb2.Event] = []
    markers: list[int] = []
    for _ in range(count + 100):
        if len(events) >= count and markers:
            break
        response = next(stream)
        events.extend(response.events)
        if response.caught_up:
            markers.append(len(events))
    assert len(events) == count, f"wanted {count} events, got {len(events)}"
    return events, markers


def test_follow_from_the_middle(shared: RunningServer) -> None:
    """A follower started at seq k gets k and later, then caught_up, then live events."""
    stub = shared.stub()
    append(stub, "mid", *[f"m{i}" for i in range(10)])
    stream = follow(stub, "mid", seq=4)
    try:
        stored, marker = read_until_caught_up(stream)
        assert seqs(stored) == [4, 5, 6, 7, 8, 9]
        assert marker.next_seq == 10
        append(stub, "mid", "m10")
        assert seqs(read_live(stream, 1)) == [10]
    finally:
        stream.cancel()


def test_follow_past_the_end_waits_for_its_seq(shared: RunningServer) -> None:
    """A follower started past the end waits, skips nothing it asked for, and gets seq k on."""
    stub = shared.stub()
    append(stub, "ahead", "a", "b", "c")
    stream = follow(stub, "ahead", seq=5)
    try:
        stored, marker = read_until_caught_up(stream)
        assert stored == []
        assert marker.next_seq == 3
        assert append(stub, "ahead", "d", "e") == [3, 4]  # before the follower's seq
        assert append(stub, "ahead", "f") == [5]
        append(stub, "ahead", "g")
        live = read_live(stream, 2)
        assert seqs(live) == [5, 6]
        assert contents(live) == ["f", "g"]
    finally:
        stream.cancel()


def test_follow_session_created_later(shared: RunningServer) -> None:
    """Following a session that does not exist yet delivers its events once it is created."""
    stub = shared.stub()
    stream = follow(stub, "later")
    try:
        stored, marker = read_until_caught_up(stream)
        assert stored == []
        assert marker.next_seq == 0
        append(stub, "later", "first")
        append(stub, "later", "second")
        live = read_live(stream, 2)
        assert seqs(live) == [0, 1]
        assert contents(live) == ["first", "second"]
    finally:
        stream.cancel()


@pytest.mark.serial  # heartbeats at an interval, within 2 s
def test_heartbeat_carries_next_seq(tmp_path: Path) -> None:
    """An idle follow stream gets event-less heartbeats with the session's current next_seq."""
    with running_server(tmp_path / "data", heartbeat_seconds=0.2) as server:
        stub = server.stub()
        append(stub, "hb", "a", "b")
        stream = follow(stub, "hb")
        try:
            _, marker = read_until_caught_up(stream)
            assert marker.next_seq == 2
            for _ in range(2):
                started = time.monotonic()
                beat = next(stream)
                assert time.monotonic() - started < 2.0
                assert list(beat.events) == []
                assert not beat.caught_up
                assert beat.next_seq == 2
            append(stub, "hb", "c")
            beat = skip_heartbeats(stream)
            assert seqs(list(beat.events)) == [2]
            after = next(stream)
            assert list(after.events) == []
            assert after.next_seq == 3
        finally:
            stream.cancel()


def skip_heartbeats(stream: Stream, limit: int = 50) -> pb.SinceResponse:
    """The next response that carries events."""
    for _ in range(limit):
        response = next(stream)
        if response.events:
            return response
    raise AssertionError(f"no events within {limit} responses")


@pytest.mark.in_process
def test_cancel_frees_the_server_side(server: ThreadedServer) -> None:
    """Cancelled follow streams leave no follower registered on the server."""
    stub = server.stub()
    append(stub, "x", "a")
    streams = [follow(stub, "x"), follow(stub, "x"), follow(stub, "y")]
    try:
        for stream in streams:
            read_until_caught_up(stream)
        assert follower_count(server) == 3
    finally:
        for stream in streams:
            stream.cancel()
    deadline = time.monotonic() + 5.0
    while follower_count(server) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert follower_count(server) == 0


@pytest.mark.serial  # ends within 5 s of the shutdown
def test_shutdown_ends_follow_with_unavailable(server: RunningServer) -> None:
    """Stopping the server ends an open follow stream with UNAVAILABLE and ErrorInfo next_seq."""
    # An own channel: RunningServer.stop closes the channels it handed out before stopping.
    channel = grpc.insecure_channel(server.address)
    try:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        append(stub, "bye", "a", "b", "c")
        stream = follow(stub, "bye")
        stored, _ = read_until_caught_up(stream)
        assert seqs(stored) == [0, 1, 2]
        stopper = threading.Thread(target=server.stop, daemon=True)
        started = time.monotonic()
        stopper.start()
        with pytest.raises(grpc.RpcError) as caught:
            next(stream)
        stopper.join(15)
        assert not stopper.is_alive()
        assert time.monotonic() - started < 5.0
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        info = error_info(caught.value)
        assert info.reason == "UNAVAILABLE"
        assert info.domain == "sessionlog"
        assert info.metadata["next_seq"] == "3"
    finally:
        channel.close()


@pytest.mark.serial  # counts responses per pacing interval
def test_paced_followers_get_several_commits_per_response_and_lose_none(tmp_path: Path) -> None:
    """With a send rate of 4 responses/s and 2 followers, each stream gets at most one live
    response per half second: 30 quick commits reach both followers whole and in order, in a
    handful of responses each, not one response per commit."""
    with running_server(tmp_path / "data", follow_send_rate=4) as server:
        stub = server.stub()
        append(stub, "paced", "stored")
        streams = [follow(stub, "paced"), follow(stub, "paced")]
        try:
            for stream in streams:
                read_until_caught_up(stream)
            started = time.monotonic()
            for i in range(30):
                append(stub, "paced", f"live {i}")
            for stream in streams:
                events: list[event_pb2.Event] = []
                responses = 0
                while len(events) < 30:
                    response = next(stream)
                    if response.events:
                        responses += 1
                        events.extend(response.events)
                assert seqs(events) == list(range(1, 31))
                assert contents(events) == [f"live {i}" for i in range(30)]
                assert responses <= 1 + (time.monotonic() - started) / 0.5 + 1
                assert responses < 30
        finally:
            for stream in streams:
                stream.cancel()


def test_pacing_leaves_a_lone_follower_prompt(tmp_path: Path) -> None:
    """At the default rate one follower's pace is a fraction of a millisecond: each commit goes
    out at once, in its own response."""
    with running_server(tmp_path / "data") as server:
        stub = server.stub()
        stream = follow(stub, "prompt")
        try:
            read_until_caught_up(stream)
            for i in range(5):
                append(stub, "prompt", f"m{i}")
                response = skip_heartbeats(stream)
                assert seqs(list(response.events)) == [i]
        finally:
            stream.cancel()


@pytest.mark.serial  # ends within 3 s
def test_a_paced_follower_ends_at_once_on_shutdown_with_its_resume_point(tmp_path: Path) -> None:
    """A stream holding its next read for its turn (rate 1/s shared by four followers: four
    seconds apart) does not sleep through shutdown: it ends with UNAVAILABLE and the seq to
    resume from, within the grace (and well before its turn, even on a busy machine)."""
    with (
        running_server(tmp_path / "data", follow_send_rate=1, shutdown_grace_seconds=0.3) as server,
        grpc.insecure_channel(server.address) as own,  # not the server's: stop() closes those
    ):
        stub = pb_grpc.SessionLogServiceStub(own)  # type: ignore[no-untyped-call]
        idle = [follow(stub, f"paced-idle-{i}") for i in range(3)]  # followers share the rate
        for other in idle:
            read_until_caught_up(other)
        stream = follow(stub, "paced-stop")
        read_until_caught_up(stream)
        append(stub, "paced-stop", "one")
        assert seqs(list(skip_heartbeats(stream).events)) == [0]
        append(stub, "paced-stop", "two")  # wakes the stream, which now waits for its turn
        time.sleep(0.1)
        started = time.monotonic()
        stopper = threading.Thread(target=server.stop, kwargs={"grace": 0.3})
        stopper.start()
        events, ended = _drain(stream)
        stopper.join(10)
        assert time.monotonic() - started < 3.0
        assert ended.code() == grpc.StatusCode.UNAVAILABLE
        assert int(error_info(ended).metadata["next_seq"]) == 1 + len(events)


def _drain(stream: Stream) -> tuple[list[event_pb2.Event], grpc.RpcError]:
    """Every event a stream still delivers, and the error that ends it."""
    events: list[event_pb2.Event] = []
    try:
        for response in stream:
            events.extend(response.events)
    except grpc.RpcError as error:
        return events, error
    raise AssertionError("the stream ended without an error")


@pytest.mark.serial  # back-to-back responses within 3 s
def test_pacing_never_slows_a_stream_that_is_behind(tmp_path: Path) -> None:
    """Pacing holds a caught-up stream's next read, not the batches of one that fell behind:
    at a rate of one response per second, 2 MB committed at once still arrives within about one
    turn, not one batch per second."""
    with running_server(tmp_path / "data", follow_send_rate=1) as server:
        stub = server.stub()
        stream = follow(stub, "behind")
        read_until_caught_up(stream)
        append(stub, "behind", "first")
        assert seqs(list(skip_heartbeats(stream).events)) == [0]
        big = "x" * 20_000
        for _ in range(10):
            stub.Append(
                pb.AppendRequest(session_id="behind", events=[user(big) for _ in range(10)]),
                timeout=10,
            )
        started = time.monotonic()
        events: list[event_pb2.Event] = []
        responses = 0
        while len(events) < 100:
            response = next(stream)
            responses += 1
            events.extend(response.events)
        assert seqs(events) == list(range(1, 101))
        assert responses >= 8  # 2 MB take several 256 KiB batches...
        assert time.monotonic() - started < 3.0  # ...sent back to back, not a second apart
        stream.cancel()
