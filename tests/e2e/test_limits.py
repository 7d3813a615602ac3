"""Configured limits: each refusal names the limit and its value, and a refused call writes nothing.

Limits covered: events per call (Append, CreateSession, SeedSession), event size, data depth,
gRPC message size (requests and the Append reply), open streams in total and per connection.
The last test opens thousands of idle follow streams against a server process and measures
what each one costs in resident memory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog import fold
from sessionlog.testing import ProcessServer, RunningServer, error_info
from sessionlog.v1 import event_pb2, message_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import get, nested, user
from tests.e2e._proc import ServerProcess, free_port, running_server

Stub = pb_grpc.SessionLogServiceStub
TIMEOUT = 10.0
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
SEPARATE_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
"""Channel option: do not share a TCP connection with other channels to the same address."""


def stub(channel: grpc.Channel) -> Stub:
    return pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]


def log_of(server: RunningServer, session_id: str) -> list[bytes]:
    """The stored events of a session, as bytes."""
    responses = server.stub().Since(pb.SinceRequest(session_id=session_id), timeout=TIMEOUT)
    return [e.SerializeToString() for r in responses for e in r.events]


def assert_limit_error(
    error: grpc.RpcError, code: grpc.StatusCode, reason: str, limit: int
) -> dict[str, str]:
    """Code, reason, the limit in metadata and in the message; returns the metadata."""
    assert error.code() == code, error
    info = error_info(error)
    assert info.reason == reason
    assert info.metadata["limit"] == str(limit)
    assert str(limit) in (error.details() or ""), "the message names the limit's value"
    return dict(info.metadata)


# -- events per call ------------------------------------------------------------------------------


@pytest.fixture
def small_batches(tmp_path: Path) -> Iterator[RunningServer]:
    """A server that takes at most 3 events per Append, CreateSession or SeedSession."""
    with running_server(tmp_path / "data", max_events_per_append=3) as server:
        yield server


def test_append_over_the_events_per_call_limit_is_refused(small_batches: RunningServer) -> None:
    """4 events when 3 are allowed: TOO_MANY_EVENTS naming count and limit, nothing written;
    3 events still go through."""
    client = small_batches.stub()
    client.Append(pb.AppendRequest(session_id="s", events=[user("first")]), timeout=TIMEOUT)
    before = log_of(small_batches, "s")
    with pytest.raises(grpc.RpcError) as caught:
        client.Append(pb.AppendRequest(session_id="s", events=[user()] * 4), timeout=TIMEOUT)
    metadata = assert_limit_error(caught.value, INVALID_ARGUMENT, "TOO_MANY_EVENTS", 3)
    assert metadata["count"] == "4"
    assert "--max-events-per-append" in (caught.value.details() or "")
    assert log_of(small_batches, "s") == before
    reply = client.Append(pb.AppendRequest(session_id="s", events=[user()] * 3), timeout=TIMEOUT)
    assert reply.next_seq == 4


def test_lenient_append_over_the_limit_is_refused_whole(small_batches: RunningServer) -> None:
    """The events-per-call limit is not a per-event drop: a lenient call over it fails whole."""
    request = pb.AppendRequest(session_id="lenient", events=[user()] * 5, lenient=True)
    with pytest.raises(grpc.RpcError) as caught:
        small_batches.stub().Append(request, timeout=TIMEOUT)
    assert_limit_error(caught.value, INVALID_ARGUMENT, "TOO_MANY_EVENTS", 3)
    assert not get(small_batches.stub(), "lenient").exists


def test_create_session_over_the_events_per_call_limit_is_refused(
    small_batches: RunningServer,
) -> None:
    """CreateSession with 4 initial events is refused and creates nothing."""
    request = pb.CreateSessionRequest(session_id="created", events=[user()] * 4)
    with pytest.raises(grpc.RpcError) as caught:
        small_batches.stub().CreateSession(request, timeout=TIMEOUT)
    assert_limit_error(caught.value, INVALID_ARGUMENT, "TOO_MANY_EVENTS", 3)
    assert not get(small_batches.stub(), "created").exists


def test_seed_session_over_the_events_per_call_limit_is_refused(
    small_batches: RunningServer,
) -> None:
    """SeedSession with 4 messages is refused and creates nothing; 3 messages seed fine."""
    message = message_pb2.Message(role=message_pb2.ROLE_USER, content="m")
    client = small_batches.stub()
    with pytest.raises(grpc.RpcError) as caught:
        client.SeedSession(
            pb.SeedSessionRequest(session_id="seeded", messages=[message] * 4), timeout=TIMEOUT
        )
    assert_limit_error(caught.value, INVALID_ARGUMENT, "TOO_MANY_EVENTS", 3)
    assert not get(small_batches.stub(), "seeded").exists
    reply = client.SeedSession(
        pb.SeedSessionRequest(session_id="seeded", messages=[message] * 3), timeout=TIMEOUT
    )
    assert reply.session.event_count == 3


# -- event size and data depth -------------------------------------------------------------------


def test_event_over_the_configured_size_is_refused(tmp_path: Path) -> None:
    """With max_event_bytes 2048, a 3000-byte event is EVENT_TOO_LARGE naming the limit and the
    event's size, its batch is not written, and a 1500-byte event is accepted."""
    limits = fold.Limits(max_event_bytes=2048)
    with running_server(tmp_path / "data", limits=limits) as server:
        client = server.stub()
        big = user("x" * 3000)
        request = pb.AppendRequest(session_id="sized", events=[user("ok"), big])
        with pytest.raises(grpc.RpcError) as caught:
            client.Append(request, timeout=TIMEOUT)
        metadata = assert_limit_error(caught.value, INVALID_ARGUMENT, "EVENT_TOO_LARGE", 2048)
        assert metadata["index"] == "1"
        assert int(metadata["size"]) > 2048
        assert not get(server.stub(), "sized").exists
        reply = client.Append(
            pb.AppendRequest(session_id="sized", events=[user("y" * 1500)]), timeout=TIMEOUT
        )
        assert reply.next_seq == 1


def test_data_deeper_than_the_configured_depth_is_refused(tmp_path: Path) -> None:
    """With max_data_depth 5, depth 5 is accepted and depth 6 is UNSERIALIZABLE_EVENT_DATA whose
    message names the limit; nothing of the failed call is written."""
    with running_server(tmp_path / "data", limits=fold.Limits(max_data_depth=5)) as server:
        client = server.stub()
        ok = event_pb2.Event(type=event_pb2.EVENT_TYPE_TOOL_CALL)
        ok.data.update(nested(5))
        assert client.Append(pb.AppendRequest(session_id="deep", events=[ok])).next_seq == 1
        too_deep = event_pb2.Event(type=event_pb2.EVENT_TYPE_TOOL_CALL)
        too_deep.data.update(nested(6))
        with pytest.raises(grpc.RpcError) as caught:
            client.Append(pb.AppendRequest(session_id="deep", events=[too_deep]), timeout=TIMEOUT)
        assert caught.value.code() == INVALID_ARGUMENT
        info = error_info(caught.value)
        assert info.reason == "UNSERIALIZABLE_EVENT_DATA"
        assert info.metadata["index"] == "0"
        assert "5 levels" in (caught.value.details() or "")
        assert get(client, "deep").event_count == 1


# -- message size ---------------------------------------------------------------------------------

MESSAGE_LIMIT = 64 << 10


@pytest.fixture
def small_messages(tmp_path: Path) -> Iterator[RunningServer]:
    """A server whose gRPC messages are at most 64 KiB (events at most 16 KiB)."""
    with running_server(
        tmp_path / "data",
        max_message_bytes=MESSAGE_LIMIT,
        limits=fold.Limits(max_event_bytes=16 << 10),
    ) as server:
        yield server


def test_an_append_whose_reply_would_not_fit_is_refused_before_writing(
    small_messages: RunningServer,
) -> None:
    """A request under the message limit whose reply (events plus seq and time) could pass it is
    BATCH_TOO_LARGE naming the limit, and nothing is written."""
    events = [user("m" * 24) for _ in range(1100)]
    request = pb.AppendRequest(session_id="batch", events=events)
    assert request.ByteSize() < MESSAGE_LIMIT, "the request itself is accepted by gRPC"
    with pytest.raises(grpc.RpcError) as caught:
        small_messages.stub().Append(request, timeout=TIMEOUT)
    metadata = assert_limit_error(caught.value, INVALID_ARGUMENT, "BATCH_TOO_LARGE", MESSAGE_LIMIT)
    assert int(metadata["reply_bytes"]) > MESSAGE_LIMIT
    assert not get(small_messages.stub(), "batch").exists


def test_a_request_over_the_message_limit_is_refused_by_grpc(
    small_messages: RunningServer,
) -> None:
    """A 70 KiB Append (each event within the event limit) is refused by gRPC itself with
    RESOURCE_EXHAUSTED, and nothing is written."""
    events = [user("z" * (14 << 10)) for _ in range(5)]
    request = pb.AppendRequest(session_id="huge", events=events)
    assert request.ByteSize() > MESSAGE_LIMIT
    with pytest.raises(grpc.RpcError) as caught:
        small_messages.stub().Append(request, timeout=TIMEOUT)
    assert caught.value.code() == RESOURCE_EXHAUSTED
    assert str(MESSAGE_LIMIT) in (caught.value.details() or ""), "gRPC names the limit"
    assert not get(small_messages.stub(), "huge").exists


def test_a_log_larger_than_one_message_is_read_in_several(small_messages: RunningServer) -> None:
    """Since splits a log larger than the message limit into responses that each fit."""
    client = small_messages.stub()
    for _ in range(6):
        client.Append(
            pb.AppendRequest(session_id="long", events=[user("q" * 6000)] * 3), timeout=TIMEOUT
        )
    responses = list(client.Since(pb.SinceRequest(session_id="long"), timeout=TIMEOUT))
    assert sum(len(r.events) for r in responses) == 18
    assert len(responses) > 1
    assert all(r.ByteSize() <= MESSAGE_LIMIT for r in responses)


# -- open streams ---------------------------------------------------------------------------------


@pytest.fixture
def few_streams(tmp_path: Path) -> Iterator[RunningServer]:
    """A server allowing 3 open streams in total and 2 per connection."""
    with running_server(tmp_path / "data", max_streams=3, max_streams_per_connection=2) as server:
        yield server


def open_follow(channel: grpc.Channel, session_id: str) -> Any:
    """Start a follow stream and wait for its caught_up response (so the server counts it)."""
    call = stub(channel).Since(pb.SinceRequest(session_id=session_id, follow=True), timeout=60)
    for _ in range(100):
        if next(call).caught_up:
            return call
    raise AssertionError("no caught_up response")


def refused_stream(channel: grpc.Channel, session_id: str) -> grpc.RpcError:
    call = stub(channel).Since(pb.SinceRequest(session_id=session_id, follow=True), timeout=60)
    with pytest.raises(grpc.RpcError) as caught:
        next(call)
    return caught.value


def open_when_freed(channel: grpc.Channel, session_id: str, seconds: float = 5.0) -> Any:
    """Open a follow stream, retrying while the server has not yet released a closed one."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return open_follow(channel, session_id)
        except grpc.RpcError as error:
            if error.code() != RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
        time.sleep(0.02)


def test_streams_per_connection_are_limited(few_streams: RunningServer) -> None:
    """Two follow streams on one connection open; the third on it is TOO_MANY_STREAMS naming the
    limit (2) while another connection still opens one; closing one frees its slot."""
    with (
        grpc.insecure_channel(few_streams.address, options=SEPARATE_CONNECTION) as one,
        grpc.insecure_channel(few_streams.address, options=SEPARATE_CONNECTION) as two,
    ):
        first, second = open_follow(one, "a"), open_follow(one, "b")
        error = refused_stream(one, "c")
        assert_limit_error(error, RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS", 2)
        assert "--max-streams-per-connection" in (error.details() or "")
        other = open_follow(two, "c")
        first.cancel()
        again = open_when_freed(one, "d")
        for call in (second, other, again):
            call.cancel()


def test_streams_in_total_are_limited(few_streams: RunningServer) -> None:
    """Three streams over two connections fill the server; a fourth, on a fresh connection, is
    TOO_MANY_STREAMS naming the limit (3); closing one lets the next in; Since without follow
    counts too, and no write is affected."""
    channels = [
        grpc.insecure_channel(few_streams.address, options=SEPARATE_CONNECTION) for _ in range(3)
    ]
    try:
        calls = [open_follow(channels[0], "a"), open_follow(channels[1], "b")]
        calls.append(open_follow(channels[1], "c"))
        error = refused_stream(channels[2], "d")
        assert_limit_error(error, RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS", 3)
        assert "--max-streams" in (error.details() or "")
        with pytest.raises(grpc.RpcError) as caught:
            list(stub(channels[2]).Since(pb.SinceRequest(session_id="d"), timeout=TIMEOUT))
        assert error_info(caught.value).reason == "TOO_MANY_STREAMS"
        reply = stub(channels[2]).Append(pb.AppendRequest(session_id="a", events=[user()]))
        assert reply.next_seq == 1, "unary calls are not streams"
        calls.pop(0).cancel()
        calls.append(open_when_freed(channels[2], "d"))
        assert len(calls) == 3
        for call in calls:
            call.cancel()
    finally:
        for channel in channels:
            channel.close()


def test_a_refused_stream_leaks_no_slot(few_streams: RunningServer) -> None:
    """Many refused streams leave the counts as they were: after closing the open ones, the
    full allowance opens again."""
    with grpc.insecure_channel(few_streams.address, options=SEPARATE_CONNECTION) as channel:
        calls = [open_follow(channel, "a"), open_follow(channel, "b")]
        for _ in range(20):
            assert refused_stream(channel, "c").code() == RESOURCE_EXHAUSTED
        for call in calls:
            call.cancel()
        reopened = [open_when_freed(channel, "a"), open_when_freed(channel, "b")]
        for call in reopened:
            call.cancel()


# -- thousands of idle follow streams, measured --------------------------------------------------

IDLE_STREAMS = 2000
IDLE_CHANNELS = 8
WAVE = 250
"""Streams opened at a time; each wave is caught up before the next starts."""
PER_STREAM_BOUND = 100 << 10
"""A generous ceiling on resident memory per idle follow stream."""
BURST_STREAMS = 2500
BURST_CHANNELS = 10


def resident_bytes(pid: int) -> int:
    """VmRSS of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def open_idle_streams(channels: list[grpc.Channel], count: int, wave: int) -> list[Any]:
    """``count`` follow streams on sessions nobody writes, spread over ``channels``, opened
    ``wave`` at a time; each is caught up when this returns."""
    calls: list[Any] = []
    for first in range(0, count, wave):
        batch = [
            stub(channels[i % len(channels)]).Since(
                pb.SinceRequest(session_id=f"idle-{i}", follow=True), timeout=120
            )
            for i in range(first, min(count, first + wave))
        ]
        assert all(next(call).caught_up for call in batch)
        calls += batch
    return calls


def test_thousands_of_idle_follow_streams_cost_little_memory(tmp_path: Path) -> None:
    """2,000 idle follow streams on a server process cost well under 100 KiB each; the 2,001st
    is refused at --max-streams; once closed, the server serves and opens streams again."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    args = ["--data", str(tmp_path / "data"), "--listen", address, "--log-level", "warning"]
    args += ["--max-streams", str(IDLE_STREAMS), "--heartbeat", "300"]
    with ServerProcess(args, tmp_path) as process:
        process.wait_serving(address)
        channels = [
            grpc.insecure_channel(address, options=SEPARATE_CONNECTION)
            for _ in range(IDLE_CHANNELS + 1)
        ]
        spare = channels.pop()
        try:
            for call in open_idle_streams(channels, IDLE_CHANNELS, 1):  # warm every connection
                call.cancel()
            time.sleep(0.3)
            before = resident_bytes(process.pid)
            started = time.monotonic()
            calls = open_idle_streams(channels, IDLE_STREAMS, WAVE)
            opened_in = time.monotonic() - started
            after = resident_bytes(process.pid)
            per_stream = (after - before) / IDLE_STREAMS
            print(
                f"\nidle follow streams: {IDLE_STREAMS} opened in {opened_in:.2f}s over "
                f"{IDLE_CHANNELS} connections; server RSS {before / 2**20:.1f} MiB -> "
                f"{after / 2**20:.1f} MiB; {per_stream / 1024:.1f} KiB per stream"
            )
            assert per_stream < PER_STREAM_BOUND
            error = refused_stream(spare, "one-too-many")
            assert_limit_error(error, RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS", IDLE_STREAMS)
            for call in calls:
                call.cancel()
            reply = stub(spare).Append(pb.AppendRequest(session_id="idle-7", events=[user("a")]))
            assert reply.next_seq == 1
            follower = open_when_freed(spare, "idle-7", seconds=20)
            follower.cancel()
            print(f"server RSS after closing them: {resident_bytes(process.pid) / 2**20:.1f} MiB")
        finally:
            for channel in [*channels, spare]:
                channel.close()
        assert process.stop() == 0


def test_a_burst_of_follow_streams_is_not_shed(tmp_path: Path) -> None:
    """2,500 follow streams started at once (followers reconnecting after a restart), within
    --max-streams, all open: none is CANCELLED by gRPC's pending-request shedding."""
    with running_server(
        tmp_path / "data", max_streams=BURST_STREAMS, heartbeat_seconds=300
    ) as server:
        channels = [
            grpc.insecure_channel(server.address, options=SEPARATE_CONNECTION)
            for _ in range(BURST_CHANNELS)
        ]
        try:
            calls = [
                stub(channels[i % BURST_CHANNELS]).Since(
                    pb.SinceRequest(session_id=f"burst-{i}", follow=True), timeout=60
                )
                for i in range(BURST_STREAMS)
            ]
            failed: dict[str, int] = {}
            for call in calls:
                try:
                    assert next(call).caught_up
                except grpc.RpcError as error:
                    failed[error.code().name] = failed.get(error.code().name, 0) + 1
            for call in calls:
                call.cancel()
            assert failed == {}, f"of {BURST_STREAMS} streams, these failed: {failed}"
        finally:
            for channel in channels:
                channel.close()


SHUTDOWN_STREAMS = 1000


def test_stopping_right_after_followers_hang_up_logs_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """1,000 followers cancel and the server stops at once (a fleet of workers and the server
    restarting together): each stream ends quietly, with no "unexpected failure" logged for a
    stream whose client is already gone."""
    caplog.set_level(logging.WARNING)
    with running_server(tmp_path / "data", heartbeat_seconds=300) as server:
        channels = [
            grpc.insecure_channel(server.address, options=SEPARATE_CONNECTION) for _ in range(4)
        ]
        try:
            calls = open_idle_streams(channels, SHUTDOWN_STREAMS, WAVE)
            for call in calls:
                call.cancel()
            server.stop(1.0)
        finally:
            for channel in channels:
                channel.close()
    noisy = [
        message
        for logger, level, message in logged(server, caplog)
        if level >= logging.ERROR
        and (logger.startswith("sessionlog") or "servicer method" in message)
    ]
    assert noisy == [], f"{len(noisy)} error lines, the first: {noisy[0]}"


def logged(server: RunningServer, caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, str]]:
    """(logger, level, message) of what the server logged: its processes' log lines, or, for a
    server in this process, what pytest captured."""
    if isinstance(server, ProcessServer):
        return [
            (e["logger"], logging.getLevelNamesMapping()[e["level"].upper()], e["message"])
            for e in server.log_entries()
        ]
    return [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
