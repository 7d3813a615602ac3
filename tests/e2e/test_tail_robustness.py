"""Live tails under stress: a slow reader, vanished clients, and shutdown.

A follower that stops reading is held back by gRPC flow control: the server keeps no queue for it,
so its memory stays flat while a writer appends 100,000 events, and a fast follower of the same
session is not slowed. A client that goes away (cancel, closed channel, killed process) frees its
server-side follower at once. Shutdown ends every follow stream, even a stalled one, with
UNAVAILABLE and the position to resume from.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog import testing, wire
from sessionlog.testing import RunningServer, ThreadedServer, error_info
from sessionlog.v1 import event_pb2
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._proc import running_server
from tests.e2e._replication_cluster import (
    CALL_TIMEOUT,
    CHANNEL_OPTIONS,
    FEED,
    Cluster,
    event,
    follow_raw,
    rss_kib,
    wait_for,
)

USER = event_pb2.EVENT_TYPE_USER_MESSAGE
MIB = 1024


def since_response(raw: bytes) -> tuple[pb.SinceResponse, list[bytes]]:
    rest, events = wire.split_field(raw, 1)
    return pb.SinceResponse.FromString(rest), events


def first_seq(events: list[bytes]) -> int:
    return event_pb2.Event.FromString(events[0]).seq


@pytest.mark.serial  # the fast follower lags less than 5 s
def test_slow_follower_keeps_memory_bounded_and_fast_follower_unaffected(tmp_path: Path) -> None:
    """While a follower reads one response a second, a writer appends 100,000 events (~60 MB)
    to its session: the server's anonymous memory grows far less than the backlog, a fast
    follower of the same session gets every event within seconds of the last append, and the
    slow follower, once it reads on, gets every event too: throttled, never dropped."""
    total, batch = 100_000, 500
    pad = "p" * 500
    with Cluster(tmp_path) as cluster:
        server = cluster.primary()
        slow = follow_raw(server.channel, "hot", timeout=90)
        response, events = since_response(next(slow))
        assert (response.caught_up, events) == (True, [])
        fast_channel = grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS)
        fast = follow_raw(fast_channel, "hot", timeout=90)
        fast_state: dict[str, Any] = {"count": 0, "next": 0, "done": None, "error": None}
        fast_ready = threading.Event()

        def read_fast() -> None:
            try:
                for _ in range(total):
                    fast_ready.set()
                    _, got = since_response(next(fast))
                    if got:
                        assert first_seq(got) == fast_state["next"], "gap or duplicate"
                        fast_state["next"] += len(got)
                        fast_state["count"] += len(got)
                    if fast_state["count"] >= total:
                        fast_state["done"] = time.monotonic()
                        return
            except BaseException as error:
                fast_state["error"] = error

        fast_reader = threading.Thread(target=read_fast, daemon=True)
        fast_reader.start()
        assert fast_ready.wait(10)
        before = rss_kib(server.pid)
        written: dict[str, float] = {}

        # One batch built once and sent again and again: the events differ by seq, and the
        # test process spends its CPU on reading, not on building protobufs.
        request = pb.AppendRequest(
            session_id="hot", events=[event(USER, f"{i}{pad}") for i in range(batch)]
        )

        def write() -> None:
            stub = server.stub()
            for _ in range(total // batch):
                stub.Append(request, timeout=30)
            written["at"] = time.monotonic()

        started = time.monotonic()
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        slow_events: list[bytes] = []
        for _ in range(6):  # one response a second, while the writer runs
            time.sleep(1.0)
            slow_events.extend(since_response(next(slow))[1])
        writer.join(60)
        assert "at" in written, "the writer did not finish in time"
        fast_reader.join(30)
        assert fast_state["error"] is None, fast_state["error"]
        assert fast_state["count"] == total
        after = rss_kib(server.pid)  # the slow follower is still open, ~all of the log unread
        fast_lag = fast_state["done"] - written["at"]
        for _ in range(total):  # now read on quickly: every event is there, in order
            if len(slow_events) >= total:
                break
            slow_events.extend(since_response(next(slow))[1])
        slow.cancel()
        fast.cancel()
        fast_channel.close()
        seqs = [event_pb2.Event.FromString(raw).seq for raw in slow_events]
        assert seqs == list(range(total))
        growth_anon = (after["RssAnon"] - before["RssAnon"]) / MIB
        growth_rss = (after["VmRSS"] - before["VmRSS"]) / MIB
        print(
            f"\n[tail] 100k events (~{total * len(pad) / 1e6:.0f} MB) written in "
            f"{written['at'] - started:.1f}s ({total / (written['at'] - started):,.0f} events/s) "
            f"with a 1-response/s follower open: server VmRSS {before['VmRSS'] / MIB:.0f} -> "
            f"{after['VmRSS'] / MIB:.0f} MiB (+{growth_rss:.0f}; file-backed LMDB pages "
            f"included), RssAnon {before['RssAnon'] / MIB:.0f} -> {after['RssAnon'] / MIB:.0f} "
            f"MiB (+{growth_anon:.0f}), peak VmHWM {after['VmHWM'] / MIB:.0f} MiB; fast "
            f"follower had every event {fast_lag * 1000:.0f} ms after the last append"
        )
        assert growth_anon < 64, f"server heap grew {growth_anon:.0f} MiB for one slow reader"
        assert growth_rss < 200
        assert fast_lag < 5.0


def follower_count(server: ThreadedServer) -> int:
    """The server's registered followers (Since and Changes), read on its event loop."""

    async def count() -> int:
        return server.server._notifier.follower_count

    result: int = server.run(count())
    return result


def freed_within(server: ThreadedServer, expected: int, timeout: float = 1.0) -> float:
    return wait_for(
        f"follower count {expected}", lambda: follower_count(server) == expected, timeout, 0.005
    )


CLIENT = """
import sys, time, grpc
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
channel = grpc.insecure_channel(sys.argv[1])
stub = pb_grpc.SessionLogServiceStub(channel)
streams = [stub.Since(pb.SinceRequest(session_id=f"gone{i}", follow=True)) for i in range(3)]
for stream in streams:
    while not next(stream).caught_up:
        pass
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.in_process
def test_clients_that_go_away_free_their_followers_at_once(tmp_path: Path) -> None:
    """A cancelled stream, a closed channel, a stalled stream's cancel and a SIGKILLed client
    process each free their server-side followers within a second (no heartbeat needed: the
    server's heartbeat interval here is the default 15 s)."""
    with testing.running_server(tmp_path / "data") as server:
        stub = server.stub()
        stub.Append(pb.AppendRequest(session_id="busy", events=[event(USER, "x" * 2000)] * 1000))
        channel = grpc.insecure_channel(server.address)
        feed = channel.unary_stream(
            f"{FEED}/Changes", request_serializer=rpb.ChangesRequest.SerializeToString
        )
        changes = feed(rpb.ChangesRequest(follow=True), timeout=60)
        while not rpb.ChangesResponse.FromString(wire.split_field(next(changes), 1)[0]).caught_up:
            pass
        cancelled = follow_raw(server.channel(), "quiet", timeout=60)
        assert since_response(next(cancelled))[0].caught_up
        stalled = follow_raw(server.channel(), "busy", timeout=60)
        next(stalled)  # one response read, ~2 MB left unread: the server is blocked on it
        for _ in range(3):
            stub.Append(pb.AppendRequest(session_id="busy", events=[event(USER, "more")]))
        time.sleep(0.2)
        assert follower_count(server) == 3  # the feed, "quiet", and "busy" parked in a write
        client = subprocess.Popen(
            [sys.executable, "-c", CLIENT, server.address],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=tmp_path,
        )
        try:
            assert client.stdout is not None
            assert client.stdout.readline().strip() == b"ready"
            assert follower_count(server) == 6
            os.kill(client.pid, signal.SIGKILL)
            client.wait(10)
            killed = freed_within(server, 3)
        finally:
            if client.poll() is None:
                client.kill()
                client.wait(10)
            if client.stdout is not None:
                client.stdout.close()
        cancelled.cancel()
        by_cancel = freed_within(server, 2)
        channel.close()  # the feed follower's connection goes away without a cancel
        by_close = freed_within(server, 1)
        stalled.cancel()  # blocked in a flow-controlled write, not waiting for a commit
        by_stalled = freed_within(server, 0)
        print(
            f"\n[tail] followers freed: killed client {killed * 1000:.0f} ms, cancel "
            f"{by_cancel * 1000:.0f} ms, closed channel {by_close * 1000:.0f} ms, stalled "
            f"stream {by_stalled * 1000:.0f} ms"
        )


@pytest.mark.serial  # ends within 5 s of the shutdown
def test_shutdown_ends_since_and_changes_follows_with_resume_point(tmp_path: Path) -> None:
    """SIGTERM on a server process ends its Since and Changes follow streams with UNAVAILABLE,
    each naming in ErrorInfo metadata where to resume, and the process exits 0 promptly."""
    with Cluster(tmp_path) as cluster:
        server = cluster.primary()
        stub = server.stub()
        for n in range(4):
            stub.Append(pb.AppendRequest(session_id="s", events=[event(USER, str(n))] * 3))
        own = grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS)
        try:
            since = follow_raw(own, "s")
            got = 0
            while True:
                response, events = since_response(next(since))
                got += len(events)
                if response.caught_up:
                    break
            feed = own.unary_stream(
                f"{FEED}/Changes", request_serializer=rpb.ChangesRequest.SerializeToString
            )
            changes = feed(rpb.ChangesRequest(start_position=2, follow=True), timeout=30)
            seen = 0
            while True:
                rest, records = wire.split_field(next(changes), 1)
                seen += len(records)
                if rpb.ChangesResponse.FromString(rest).caught_up:
                    break
            assert (got, seen) == (12, 3)
            started = time.monotonic()
            assert server.process is not None
            server.process.signal(signal.SIGTERM)
            ends = []
            for stream in (since, changes):
                extra, error = read_to_end(stream, limit=100)
                assert extra == 0
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                info = error_info(error)
                assert info.reason == "UNAVAILABLE"
                ends.append(info.metadata["next_seq"])
            assert ends == ["12", "5"]  # Since: the next seq; Changes: the next position
            assert server.process.wait() == 0
            assert time.monotonic() - started < 5.0
        finally:
            own.close()


def read_to_end(stream: Any, limit: int = 10_000) -> tuple[int, grpc.RpcError]:
    """Read a Since stream until it fails: the events received, and the error it ended with."""
    received = 0
    for _ in range(limit):
        try:
            raw = next(stream)
        except grpc.RpcError as error:
            return received, error
        received += len(since_response(raw)[1])
    raise AssertionError(f"the stream did not end within {limit} responses")


def stalled_follower(server: RunningServer, channel: grpc.Channel) -> tuple[Any, int]:
    """A follower of a ~10 MB session that read one response and stopped: the server is
    blocked on writing to it (flow control). Returns the stream and the events it received."""
    stub = server.stub()
    for _ in range(10):
        stub.Append(
            pb.AppendRequest(session_id="s", events=[event(USER, "y" * 2000)] * 500),
            timeout=CALL_TIMEOUT,
        )
    stream = follow_raw(channel, "s", timeout=60)
    received = len(since_response(next(stream))[1])
    time.sleep(0.3)  # the server fills the flow-control window and blocks on its next write
    return stream, received


def test_shutdown_ends_a_stalled_follower_with_unavailable(tmp_path: Path) -> None:
    """A follower parked in flow control when shutdown starts, that reads on during the grace
    period, gets every event it was sent, then UNAVAILABLE naming the seq to resume from."""
    with running_server(tmp_path / "data", shutdown_grace_seconds=5.0) as server:
        channel = grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS)
        try:
            stream, received = stalled_follower(server, channel)
            stopper = threading.Thread(target=server.stop, kwargs={"grace": 5.0}, daemon=True)
            stopper.start()
            more, error = read_to_end(stream)
            stopper.join(20)
            assert not stopper.is_alive()
        finally:
            channel.close()
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
    info = error_info(error)
    assert info.metadata["next_seq"] == str(received + more)


@pytest.mark.serial  # stops within 6 s of its 8 s grace
def test_shutdown_ends_a_follower_whose_first_response_is_still_in_flight(tmp_path: Path) -> None:
    """A follower that has not yet read its stream's first response when shutdown starts, and
    reads during the grace period, gets that response, then UNAVAILABLE naming where to resume,
    and the server stops before its grace period is over. (The status must not try to send the
    response headers a second time: gRPC refused that batch, and the call stayed open until the
    grace period ran out, ending with a bare "Cancelling all calls".)"""
    with running_server(tmp_path / "data", shutdown_grace_seconds=8.0) as server:
        stub = server.stub()
        for _ in range(10):
            stub.Append(
                pb.AppendRequest(session_id="s", events=[event(USER, "y" * 2000)] * 500),
                timeout=CALL_TIMEOUT,
            )
        # A fixed 64 KiB window (no BDP probing) holds the first response back until it is read.
        options = [
            *CHANNEL_OPTIONS,
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", 65536),
        ]
        channel = grpc.insecure_channel(server.address, options=options)
        try:
            stream = follow_raw(channel, "s", timeout=60)
            time.sleep(0.5)  # the first response (megabytes) waits on flow control, unread
            started = time.monotonic()
            stopper = threading.Thread(target=server.stop, kwargs={"grace": 8.0}, daemon=True)
            stopper.start()
            time.sleep(0.5)
            received, error = read_to_end(stream)
            stopper.join(20)
            took = time.monotonic() - started
        finally:
            channel.close()
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
    assert error_info(error).metadata["next_seq"] == str(received)
    assert took < 6.0, f"the server took {took:.1f} s of its 8 s grace to stop"


def test_follower_paused_through_the_grace_period_ends_unavailable(tmp_path: Path) -> None:
    """A follower that reads nothing until shutdown's grace period is over still ends with
    UNAVAILABLE (reconnect) after every event it was sent, densely from its start.

    Its ErrorInfo cannot reach it: the status is queued behind the data flow control holds
    back, and gRPC cancels the call when the grace period ends. A follower that reads during
    the grace period gets the ErrorInfo (the test above); this one resumes from its last seq.
    """
    with running_server(tmp_path / "data") as server:
        channel = grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS)
        try:
            stream, _ = stalled_follower(server, channel)
            server.stop(grace=0.5)
            more, error = read_to_end(stream)
        finally:
            channel.close()
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
    assert more > 0, "the events already sent arrive before the stream ends"
