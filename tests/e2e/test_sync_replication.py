"""Synchronous replication (`--ack replica`) with real processes: a primary and its replicas as
`sessionlog serve` children on 127.0.0.1, faults by SIGKILL and SIGSTOP/SIGCONT by PID.

An acknowledged write is on K replicas when its reply arrives; with fewer replicas current, every
write RPC fails UNAVAILABLE / REPLICAS_UNAVAILABLE after --sync-timeout, committed on the
primary (a retry with its request id returns the original result); a replica on another history
never counts.
"""

from __future__ import annotations

import asyncio
import queue
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from sessionlog.testing import error_info
from sessionlog.v1 import event_pb2, message_pb2
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client import AsyncClient, Client, Retry, errors
from tests.e2e._proc import free_port
from tests.e2e._replication_cluster import (
    CALL_TIMEOUT,
    Cluster,
    Node,
    changes_raw,
    event,
    since_raw,
    wait_for,
)

USER = event_pb2.EVENT_TYPE_USER_MESSAGE
REPORT_PROGRESS = "/sessionlog.v1.ReplicationService/ReportProgress"


def ack_replica(timeout: float, replicas: int = 0) -> list[str]:
    flags = ["--ack", "replica", "--sync-timeout", f"{timeout:g}"]
    return flags + (["--sync-replicas", str(replicas)] if replicas else [])


def append(node: Node, session_id: str, text: str, request_id: str = "") -> pb.AppendResponse:
    request = pb.AppendRequest(
        session_id=session_id, events=[event(USER, text)], request_id=request_id
    )
    reply: pb.AppendResponse = node.stub().Append(request, timeout=CALL_TIMEOUT)
    return reply


def refused_unavailable(error: grpc.RpcError) -> dict[str, str]:
    """The metadata of a REPLICAS_UNAVAILABLE refusal (AssertionError for anything else)."""
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    info = error_info(error)
    assert info.reason == "REPLICAS_UNAVAILABLE", info
    assert "committed on this primary" in error.details()
    assert "same request id" in error.details()
    return dict(info.metadata)


def note(text: str) -> dict[str, object]:
    """A user message for the Python client."""
    return {"type": "user_message", "data": {"content": text}}


def stored_texts(node: Node, session_id: str) -> list[str]:
    events = [event_pb2.Event.FromString(raw) for raw in since_raw(node.channel, session_id)]
    return [str(e.data["content"]) for e in events]


def test_an_acknowledged_append_is_on_the_replica_when_its_reply_arrives(tmp_path: Path) -> None:
    """K=1: the replica holds every acknowledged append at the moment of its reply. Writers
    append under load; the primary is SIGKILLed in mid-stream, right after an ack, and the
    replica alone holds every event any writer was told is stored."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary(args=ack_replica(10))
        replica = cluster.replica(primary, "replica")
        acked: list[event_pb2.Event] = []
        lock = threading.Lock()
        stop = threading.Event()

        def write(writer: int) -> None:
            with grpc.insecure_channel(primary.address) as channel:
                stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                for number in range(500):
                    batch = [event(USER, f"w{writer}-{number}-{i}") for i in range(20)]
                    request = pb.AppendRequest(session_id=f"s{writer}", events=batch)
                    try:
                        reply = stub.Append(request, timeout=CALL_TIMEOUT)
                    except grpc.RpcError:
                        return  # the primary is gone: not acknowledged, nothing promised
                    with lock:
                        acked.extend(reply.events)
                        if len(acked) >= 1200:
                            stop.set()

        threads = [threading.Thread(target=write, args=(w,), daemon=True) for w in range(4)]
        for thread in threads:
            thread.start()
        assert stop.wait(60), "the writers did not get 1200 events acknowledged"
        primary.kill()  # nothing more can reach the replica after this
        for thread in threads:
            thread.join(CALL_TIMEOUT)
        held = {
            (f"s{w}", e.seq): e
            for w in range(4)
            for e in map(event_pb2.Event.FromString, since_raw(replica.channel, f"s{w}"))
        }
        with lock:
            missing = [e for e in acked if held.get((_session_of(e), e.seq)) != e]
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged events missing"


def _session_of(stored: event_pb2.Event) -> str:
    return "s" + str(stored.data["content"]).split("-")[0][1:]


@pytest.mark.serial  # fails after its 1 s sync timeout, within 5 s
def test_writes_fail_after_the_sync_timeout_while_the_replica_is_stopped(tmp_path: Path) -> None:
    """SIGSTOP the replica: every write RPC fails UNAVAILABLE / REPLICAS_UNAVAILABLE after
    --sync-timeout (committed on the primary: reads see it); after SIGCONT writes succeed again,
    and a retry with the failed append's request id returns the original result, once."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary(args=ack_replica(1))
        replica = cluster.replica(primary, "replica")
        stub = primary.stub()
        append(primary, "s", "before")
        ttl = Duration(seconds=30)
        stub.AcquireLease(pb.AcquireLeaseRequest(session_id="held", holder="w", ttl=ttl))
        replica.process.signal(signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as failed:
                append(primary, "s", "during", request_id="r-1")
            waited = time.monotonic() - started
            metadata = refused_unavailable(failed.value)
            assert metadata == {"needed": "1", "counted": "0", "position": "3"}
            assert 1.0 <= waited < 5.0, waited
            assert stored_texts(primary, "s") == ["before", "during"]  # committed here
            others = _every_other_write(stub, ttl)
            for name, future in others.items():
                error = future.exception(timeout=CALL_TIMEOUT)
                assert isinstance(error, grpc.RpcError), (name, future.result())
                refused_unavailable(error)
            release = pb.ReleaseLeaseRequest(session_id="held", holder="w")
            with pytest.raises(grpc.RpcError) as released:
                stub.ReleaseLease(release, timeout=CALL_TIMEOUT)
            refused_unavailable(released.value)
        finally:
            replica.process.signal(signal.SIGCONT)  # type: ignore[union-attr]
        retried = _retry_until_acknowledged(primary, "s", "during", "r-1")
        assert [e.seq for e in retried.events] == [1]
        stored = [event_pb2.Event.FromString(raw) for raw in since_raw(primary.channel, "s")]
        assert list(retried.events) == stored[1:2]  # the original event, its time included
        append(primary, "s", "after")
        assert stored_texts(primary, "s") == ["before", "during", "after"]
        messages = [entry.get("message", "") for entry in primary.log_entries()]
        assert sum(m.startswith("writes fail REPLICAS_UNAVAILABLE") for m in messages) == 1
        assert messages.count("writes are acknowledged by enough replicas again") == 1
        wait_for(
            "the replica holds the session", lambda: len(since_raw(replica.channel, "s")) == 3, 10
        )


@pytest.mark.serial  # fails within 2.5 s
def test_a_write_waiting_for_a_stopped_replica_fails_at_once_on_shutdown(tmp_path: Path) -> None:
    """SIGTERM to a primary whose replica is SIGSTOPped: the write waiting for the replica
    fails REPLICAS_UNAVAILABLE ("shutting down") at once, not at its 30 s --sync-timeout."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary(args=[*ack_replica(30), "--shutdown-grace", "3"])
        replica = cluster.replica(primary, "replica")
        append(primary, "s", "before")
        replica.process.signal(signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            request = pb.AppendRequest(session_id="s", events=[event(USER, "waiting")])
            pending = primary.stub().Append.future(request, timeout=30)
            wait_for("the write is committed", lambda: primary.status().position == 2, 10)
            started = time.monotonic()
            primary.process.signal(signal.SIGTERM)  # type: ignore[union-attr]
            error = pending.exception(timeout=CALL_TIMEOUT)
            took = time.monotonic() - started
            assert primary.process.wait() == 0  # type: ignore[union-attr]
        finally:
            replica.process.signal(signal.SIGCONT)  # type: ignore[union-attr]
        assert took < 2.5, took
        assert isinstance(error, grpc.RpcError)
        refused_unavailable(error)
        assert "shutting down" in error.details()


def _every_other_write(stub: Any, ttl: Duration) -> dict[str, Future[Any]]:
    """Every write RPC but Append and ReleaseLease, sent at once (each waits --sync-timeout)."""
    message = message_pb2.Message(role=message_pb2.ROLE_USER, content="hello")
    return {
        "CreateSession": stub.CreateSession.future(
            pb.CreateSessionRequest(session_id="created", events=[event(USER, "x")]),
            timeout=CALL_TIMEOUT,
        ),
        "SeedSession": stub.SeedSession.future(
            pb.SeedSessionRequest(session_id="seeded", messages=[message]), timeout=CALL_TIMEOUT
        ),
        "ForkSession": stub.ForkSession.future(
            pb.ForkSessionRequest(parent_session_id="s", session_id="forked", at_seq=0),
            timeout=CALL_TIMEOUT,
        ),
        "AcquireLease": stub.AcquireLease.future(
            pb.AcquireLeaseRequest(session_id="other", holder="w", ttl=ttl), timeout=CALL_TIMEOUT
        ),
        "RenewLease": stub.RenewLease.future(
            pb.RenewLeaseRequest(session_id="held", holder="w", ttl=ttl), timeout=CALL_TIMEOUT
        ),
    }


def _retry_until_acknowledged(
    node: Node, session_id: str, text: str, request_id: str, within: float = 20.0
) -> pb.AppendResponse:
    """Retry one append with its request id until it is acknowledged (it never writes twice)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return append(node, session_id, text, request_id=request_id)
        except grpc.RpcError as error:
            refused_unavailable(error)
            assert time.monotonic() < deadline, "never acknowledged after SIGCONT"


def test_two_sync_replicas_with_one_replica_never_acknowledge(tmp_path: Path) -> None:
    """K=2 with one replica: the replica holds the write, yet it is never acknowledged; status
    and metrics say 1 replica counts of 2 needed. A second replica makes writes succeed."""
    metrics_port = free_port()
    with Cluster(tmp_path) as cluster:
        args = [*ack_replica(0.5, replicas=2), "--metrics-listen", f"127.0.0.1:{metrics_port}"]
        primary = cluster.primary(args=args)
        replica = cluster.replica(primary, "replica")
        for attempt in range(3):
            with pytest.raises(grpc.RpcError) as failed:
                append(primary, "s", f"try-{attempt}")
            metadata = refused_unavailable(failed.value)
            assert metadata["needed"] == "2"
            assert metadata["counted"] in ("0", "1")
        wait_for("the replica holds all 3", lambda: replica.status().position == 3, 10)
        status = primary.status()
        assert (status.ack, status.sync_replicas) == (rpb.ACK_MODE_REPLICA, 2)
        [seen] = status.replicas
        assert (seen.connected, seen.counts, seen.position) == (True, True, 3)
        scraped = _metrics(metrics_port)
        assert scraped["sessionlog_sync_required_replicas"] == 2
        assert scraped["sessionlog_sync_counting_replicas"] == 1
        assert scraped["sessionlog_sync_timeouts_total"] == 3
        cluster.replica(primary, "replica2")
        reply = append(primary, "s", "with two")
        assert [e.seq for e in reply.events] == [3]


def _metrics(port: int) -> dict[str, float]:
    """The unlabelled samples of a /metrics scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if line and not line.startswith("#") and "{" not in name:
            samples[name] = float(value)
    return samples


class Reporter:
    """A ReportProgress stream written by the test: it speaks for a replica it makes up."""

    def __init__(self, node: Node, name: str) -> None:
        self.name = name
        self._reports: queue.Queue[rpb.ReportProgressRequest | None] = queue.Queue()
        call = node.channel.stream_unary(
            REPORT_PROGRESS,
            request_serializer=rpb.ReportProgressRequest.SerializeToString,
            response_deserializer=rpb.ReportProgressResponse.FromString,
        )
        self.call = call.future(self._requests(), timeout=60)

    def _requests(self) -> Iterator[rpb.ReportProgressRequest]:
        while (report := self._reports.get(timeout=60)) is not None:
            yield report

    def report(self, position: int, checksum: bytes, epoch: int = 0) -> None:
        self._reports.put(
            rpb.ReportProgressRequest(
                replica=self.name, position=position, checksum=checksum, epoch=epoch
            )
        )

    def close(self) -> None:
        self._reports.put(None)
        self.call.result(timeout=CALL_TIMEOUT)


def checksum_at(node: Node, position: int) -> bytes:
    [change] = changes_raw(node.channel, position)[:1]
    found = rpb.Change.FromString(change)
    assert found.position == position
    return found.checksum


def listed(node: Node, name: str) -> rpb.SyncReplica | None:
    return next((r for r in node.status().replicas if r.replica == name), None)


def _position_of(node: Node, name: str) -> int:
    seen = listed(node, name)
    return -1 if seen is None else seen.position


def test_a_write_waits_for_a_report_at_its_position_with_the_primarys_checksum(
    tmp_path: Path,
) -> None:
    """A write is acknowledged by the report that reaches its position, not before, and only
    with the primary's epoch; a report whose checksum is not the primary's makes that replica
    never count (status says why)."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary(args=ack_replica(10))
        impostor = Reporter(primary, "impostor")
        honest = Reporter(primary, "honest")
        try:
            honest.report(0, b"")
            pending = primary.stub().Append.future(
                pb.AppendRequest(session_id="s", events=[event(USER, "one")]), timeout=30
            )
            wait_for("the change is stored", lambda: primary.status().position == 1, 10)
            impostor.report(1, b"\x00" * 16)
            wait_for("the impostor is listed", lambda: listed(primary, "impostor") is not None, 10)
            seen = listed(primary, "impostor")
            assert seen is not None
            assert not seen.counts
            assert "checksum" in seen.detail
            time.sleep(0.3)
            assert not pending.done(), "acknowledged before any replica held it"
            honest.report(1, checksum_at(primary, 1))  # epoch 0: not the primary's (1)
            wait_for("the honest one at 1", lambda: _position_of(primary, "honest") == 1, 10)
            seen = listed(primary, "honest")
            assert seen is not None
            assert (seen.counts, seen.epoch) == (False, 0)
            assert "epoch 0, not this primary's epoch 1" in seen.detail
            time.sleep(0.3)
            assert not pending.done(), "acknowledged by a report of another epoch"
            honest.report(1, checksum_at(primary, 1), epoch=1)
            reply = pending.result(timeout=CALL_TIMEOUT)
            assert [e.seq for e in reply.events] == [0]
            seen = listed(primary, "honest")
            assert seen is not None
            assert (seen.counts, seen.epoch, seen.detail) == (True, 1, "")
            ahead = Reporter(primary, "ahead")
            ahead.report(5, b"\x00" * 16)
            wait_for("the ahead one is listed", lambda: listed(primary, "ahead") is not None, 10)
            seen = listed(primary, "ahead")
            assert seen is not None
            assert not seen.counts
            assert "does not hold" in seen.detail
            ahead.close()
        finally:
            impostor.close()
            honest.close()
        gone = listed(primary, "honest")
        assert gone is not None
        assert (gone.connected, gone.counts) == (False, False)


def test_a_replica_on_another_history_does_not_count(tmp_path: Path) -> None:
    """A replica whose folder holds another history (it was a primary of its own) is refused
    its feed and never counts: writes fail REPLICAS_UNAVAILABLE with nothing counted."""
    with Cluster(tmp_path) as cluster:
        other = cluster.primary("other")
        append(other, "s", "theirs")
        other.stop()
        primary = cluster.primary(args=ack_replica(0.5))
        with pytest.raises(grpc.RpcError) as failed:
            append(primary, "s", "ours")
        assert refused_unavailable(failed.value)["counted"] == "0"
        diverged = Node(cluster.root, "other", replica_of=primary.address)
        cluster.nodes.append(diverged)
        diverged.start(wait=False)
        wait_for(
            "the replica finds it diverged",
            lambda: diverged.status().state == rpb.REPLICATION_STATE_DIVERGED,
            15,
        )
        with pytest.raises(grpc.RpcError) as again:
            append(primary, "s", "ours again")
        assert refused_unavailable(again.value)["counted"] == "0"
        assert not any(replica.counts for replica in primary.status().replicas)


def test_the_python_clients_retry_replicas_unavailable_a_bounded_number_of_times(
    tmp_path: Path,
) -> None:
    """With no replica, an append with a request id is sent 1 + Retry.replicas_retries times
    (each waits --sync-timeout), then raises ReplicasUnavailable with needed, counted and
    position; AsyncClient the same; a write without a request id raises it after one try, a
    create_session with its generated one after as many as an append. The
    write is committed: once a replica holds it, the same request id returns the original."""
    metrics_port = free_port()
    with Cluster(tmp_path) as cluster:
        args = [*ack_replica(0.3), "--metrics-listen", f"127.0.0.1:{metrics_port}"]
        primary = cluster.primary(args=args)
        with Client(primary.address, retry=Retry(replicas_retries=2)) as client:
            with pytest.raises(errors.ReplicasUnavailable) as failed:
                client.append("s", [note("one")], request_id="r-1")
            assert (failed.value.needed, failed.value.counted, failed.value.position) == (1, 0, 1)
            assert "committed on this primary" in failed.value.message
            assert _metrics(metrics_port)["sessionlog_sync_timeouts_total"] == 3

            async def async_append() -> None:
                async with AsyncClient(primary.address, retry=Retry(replicas_retries=1)) as aio:
                    await aio.append("s", [note("one")], request_id="r-1")

            with pytest.raises(errors.ReplicasUnavailable) as again:
                asyncio.run(async_append())
            assert again.value.position == 1  # the same write: the request id replayed it
            assert _metrics(metrics_port)["sessionlog_sync_timeouts_total"] == 5
            with pytest.raises(errors.ReplicasUnavailable):
                client.create_session("other", [note("x")], request_id="")  # no id: one try
            assert _metrics(metrics_port)["sessionlog_sync_timeouts_total"] == 6
            with pytest.raises(errors.ReplicasUnavailable):
                client.create_session("other2", [note("x")])  # a generated id: retried as append
            assert _metrics(metrics_port)["sessionlog_sync_timeouts_total"] == 9
            assert client.get_session("s").session.event_count == 1
            cluster.replica(primary, "replica")
            reply = client.append("s", [note("one")], request_id="r-1")
            assert [e.seq for e in reply.events] == [0]
            assert client.get_session("s").session.event_count == 1
