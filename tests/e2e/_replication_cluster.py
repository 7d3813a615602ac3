"""A primary and its read replicas as real `sessionlog serve` processes, and raw-byte reads.

Every node is a child process on 127.0.0.1 with a port picked free, its own data folder, and a
log file in the test's tmp_path; :class:`Cluster` stops every node it started (SIGTERM by PID)
when the test ends. Reads that compare nodes fetch *raw reply bytes* (no response deserializer),
so "identical" below means byte-for-byte, not equal after parsing.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from sessionlog import wire
from sessionlog.v1 import event_pb2
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import replication_service_pb2_grpc as rpb_grpc
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._proc import READY_SECONDS, ServerProcess, free_port, health_status

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    # Reconnect fast to a server that is starting or restarting (gRPC's default waits ~1 s+).
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 250),
]
SERVICE = "/sessionlog.v1.SessionLogService"
FEED = "/sessionlog.v1.ReplicationService"
CALL_TIMEOUT = 20.0


class Node:
    """One `sessionlog serve` process: a primary, or a replica of ``replica_of``."""

    def __init__(
        self,
        root: Path,
        name: str,
        *,
        port: int = 0,
        replica_of: str = "",
        args: Sequence[str] = (),
    ) -> None:
        self.root = root
        self.name = name
        self.port = port or free_port()
        self.data = root / name
        self.replica_of = replica_of
        self.args = list(args)
        """More `serve` flags, e.g. ["--replica-timeout", "1"]."""
        self.process: ServerProcess | None = None
        self._channel: grpc.Channel | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} not started"
        return self.process.pid

    @property
    def running(self) -> bool:
        return (
            self.process is not None
            and self.process.process is not None
            and (self.process.process.poll() is None)
        )

    def start(self, *, wait: bool = True) -> Node:
        """Start the process; with ``wait``, return once its health check says SERVING (for a
        replica: once it has caught up with its primary)."""
        args = ["--data", str(self.data), "--listen", self.address]
        args += ["--log-level", "warning", "--log-format", "json"]
        if self.replica_of:
            args += ["--replica-of", self.replica_of]
        args += self.args
        self.process = ServerProcess(args, self.root, name=self.name).start()
        self._wait_listening()
        self._channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        if wait:
            self.process.wait_serving(self.address)
        return self

    def _wait_listening(self, timeout: float = READY_SECONDS) -> None:
        """Wait until the port accepts connections, so the channel's first attempt succeeds
        (a refused first attempt would put the channel into reconnect backoff)."""
        child = None if self.process is None else self.process.process
        assert child is not None, f"{self.name} not started"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child.poll() is not None:
                raise AssertionError(f"{self.name} exited before listening:\n{self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            except OSError:
                time.sleep(0.005)
                continue
            return
        raise AssertionError(f"{self.name} not listening within {timeout}s:\n{self.log()}")

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def stop(self) -> int:
        """SIGTERM by PID and wait for the exit code."""
        assert self.process is not None
        self._close_channel()
        return self.process.stop()

    def kill(self) -> int:
        """SIGKILL by PID (a crash) and reap."""
        assert self.process is not None
        self._close_channel()
        return self.process.kill()

    def log(self) -> str:
        return "" if self.process is None else self.process.log()

    @property
    def pids(self) -> list[int]:
        """Every process of this server: the one started, and its workers when it runs
        several (the started process's children, as Linux lists them)."""
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        return [self.pid, *map(int, children)]

    def log_entries(self) -> list[dict[str, Any]]:
        """The JSON log lines this run of the process has written so far."""
        entries = []
        for line in self.log().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    entries.append(json.loads(line))
        return entries

    @property
    def channel(self) -> grpc.Channel:
        assert self._channel is not None, f"{self.name} is not running"
        return self._channel

    def stub(self) -> pb_grpc.SessionLogServiceStub:
        return pb_grpc.SessionLogServiceStub(self.channel)  # type: ignore[no-untyped-call]

    def feed(self) -> rpb_grpc.ReplicationServiceStub:
        return rpb_grpc.ReplicationServiceStub(self.channel)  # type: ignore[no-untyped-call]

    def status(self) -> rpb.GetReplicationStatusResponse:
        reply: rpb.GetReplicationStatusResponse = self.feed().GetReplicationStatus(
            rpb.GetReplicationStatusRequest(), timeout=CALL_TIMEOUT
        )
        return reply

    def health(self) -> int | None:
        return health_status(self.address)


class Cluster:
    """The nodes of one test; every node still running is stopped by PID on close."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes: list[Node] = []

    def primary(
        self, name: str = "primary", *, port: int = 0, wait: bool = True, args: Sequence[str] = ()
    ) -> Node:
        node = Node(self.root, name, port=port, args=args)
        self.nodes.append(node)
        return node.start(wait=wait)

    def replica(
        self, of: Node | str, name: str, *, wait: bool = True, args: Sequence[str] = ()
    ) -> Node:
        target = of.address if isinstance(of, Node) else of
        node = Node(self.root, name, replica_of=target, args=args)
        self.nodes.append(node)
        return node.start(wait=wait)

    def close(self) -> None:
        for node in reversed(self.nodes):
            if node.running:
                node.stop()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- waiting --------------------------------------------------------------------------------------


def wait_for(what: str, check: Callable[[], bool], timeout: float, step: float = 0.02) -> float:
    """Poll ``check`` until true; the seconds it took. Fails the test after ``timeout``."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic() - started
        time.sleep(step)
    raise AssertionError(f"not within {timeout}s: {what}")


def wait_position(node: Node, position: int, timeout: float = 30.0) -> float:
    """Wait until ``node`` stores exactly the change at ``position`` as its newest."""
    seen: list[int] = []

    def reached() -> bool:
        seen.append(node.status().position)
        assert seen[-1] <= position, f"{node.name} is past the primary: {seen[-1]} > {position}"
        return seen[-1] == position

    try:
        return wait_for(f"{node.name} at position {position}", reached, timeout)
    except AssertionError as error:
        raise AssertionError(f"{error} (last seen {seen[-1:]})\n{node.log()}") from None


# -- raw reads ------------------------------------------------------------------------------------


def _unary_raw(channel: grpc.Channel, method: str, request: Any) -> bytes:
    call = channel.unary_unary(method, request_serializer=type(request).SerializeToString)
    reply: bytes = call(request, timeout=CALL_TIMEOUT)
    return reply


def since_raw(channel: grpc.Channel, session_id: str, seq: int = 0) -> list[bytes]:
    """A session's stored events from ``seq``, each exactly as the server sent it."""
    call = channel.unary_stream(
        f"{SERVICE}/Since", request_serializer=pb.SinceRequest.SerializeToString
    )
    events: list[bytes] = []
    for response in call(pb.SinceRequest(session_id=session_id, seq=seq), timeout=CALL_TIMEOUT):
        events.extend(wire.split_field(response, 1)[1])
    return events


def state_raw(channel: grpc.Channel, session_id: str, at_seq: int | None = None) -> bytes:
    request = pb.GetStateRequest(session_id=session_id, at_seq=at_seq)
    return _unary_raw(channel, f"{SERVICE}/GetState", request)


def derive_raw(channel: grpc.Channel, session_id: str, at_seq: int | None = None) -> bytes:
    request = pb.DeriveMessagesRequest(session_id=session_id, at_seq=at_seq)
    return _unary_raw(channel, f"{SERVICE}/DeriveMessages", request)


def usage_raw(channel: grpc.Channel, session_id: str) -> bytes:
    return _unary_raw(channel, f"{SERVICE}/GetUsage", pb.GetUsageRequest(session_id=session_id))


def surface_raw(channel: grpc.Channel, session_id: str, at_seq: int | None = None) -> bytes:
    request = pb.SurfaceRequest(session_id=session_id, at_seq=at_seq)
    return _unary_raw(channel, f"{SERVICE}/Surface", request)


def get_session_raw(channel: grpc.Channel, session_id: str) -> bytes:
    return _unary_raw(channel, f"{SERVICE}/GetSession", pb.GetSessionRequest(session_id=session_id))


def list_sessions(channel: grpc.Channel, page_size: int = 37) -> list[bytes]:
    """Every page of ListSessions, raw, walking the page tokens (bounded)."""
    pages: list[bytes] = []
    token = ""
    for _ in range(10_000):
        raw = _unary_raw(
            channel,
            f"{SERVICE}/ListSessions",
            pb.ListSessionsRequest(page_size=page_size, page_token=token),
        )
        pages.append(raw)
        token = pb.ListSessionsResponse.FromString(raw).next_page_token
        if not token:
            return pages
    raise AssertionError("ListSessions never ended")


def session_ids(channel: grpc.Channel) -> list[str]:
    return [
        s.session_id
        for page in list_sessions(channel, page_size=1000)
        for s in pb.ListSessionsResponse.FromString(page).sessions
    ]


def changes_raw(channel: grpc.Channel, start: int = 1) -> list[bytes]:
    """Every stored change from ``start`` (no follow), each exactly as sent, events included."""
    call = channel.unary_stream(
        f"{FEED}/Changes", request_serializer=rpb.ChangesRequest.SerializeToString
    )
    out: list[bytes] = []
    for response in call(rpb.ChangesRequest(start_position=start), timeout=CALL_TIMEOUT * 3):
        out.extend(wire.split_field(response, 1)[1])
    return out


def positions(changes: Sequence[bytes]) -> list[int]:
    return [rpb.Change.FromString(c).position for c in changes]


# -- writing ---------------------------------------------------------------------------------------


def event(kind: event_pb2.EventType, text: str, **extra: Any) -> event_pb2.Event:
    made = event_pb2.Event(type=kind)
    made.data.update({"content": text, **extra})
    return made


def conversation_batch(
    writer: int, number: int, size: int, pad: str = "", rich: bool = True
) -> list[event_pb2.Event]:
    """``size`` events of mixed kinds (surface and bookkeeping), unique per writer and number;
    ``rich`` ones also carry a metadata object with several keys."""
    kinds = (
        event_pb2.EVENT_TYPE_USER_MESSAGE,
        event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE,
        event_pb2.EVENT_TYPE_TOOL_CALL,
        event_pb2.EVENT_TYPE_TOOL_RESULT,
    )
    return [
        event(
            kinds[i % len(kinds)],
            f"w{writer}-b{number}-e{i}{pad}",
            writer=writer,
            n=number,
            **({"metadata": {"batch": number, "index": i, "tags": ["a", "b"]}} if rich else {}),
        )
        for i in range(size)
    ]


@dataclass
class WriteLog:
    """What writers were told: per session, the seqs acknowledged, in acknowledgement order."""

    acked: dict[str, list[int]] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, session_id: str, seqs: list[int]) -> None:
        with self.lock:
            self.acked.setdefault(session_id, []).extend(seqs)

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.acked.values())


def run_writers(
    address: str,
    sessions: Sequence[str],
    *,
    writers: int,
    events_per_writer: int,
    batch: int,
    deadline: float = 60.0,
    pad: str = "",
    rich: bool = True,
) -> WriteLog:
    """``writers`` threads, each appending ``events_per_writer`` events in batches of ``batch``
    to the sessions in turn (every thread touches every session). Fails on any error."""
    log = WriteLog()
    stop_at = time.monotonic() + deadline

    def write(writer: int) -> None:
        try:
            with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
                stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                for number in range(events_per_writer // batch):
                    assert time.monotonic() < stop_at, "writers ran out of time"
                    session_id = sessions[(number + writer) % len(sessions)]
                    events = conversation_batch(writer, number, batch, pad, rich)
                    reply = stub.Append(
                        pb.AppendRequest(session_id=session_id, events=events),
                        timeout=CALL_TIMEOUT,
                    )
                    log.record(session_id, [e.seq for e in reply.events])
        except BaseException as error:  # reported by the caller, not lost in the thread
            log.errors.append(error)

    threads = [threading.Thread(target=write, args=(w,), daemon=True) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(deadline + 5)
    assert not any(t.is_alive() for t in threads), "a writer thread is stuck"
    assert not log.errors, f"writers failed: {log.errors[:3]}"
    return log


def follow_raw(channel: grpc.Channel, session_id: str, seq: int = 0, timeout: float = 60.0) -> Any:
    """An open Since follow stream yielding raw response bytes (has .cancel())."""
    call = channel.unary_stream(
        f"{SERVICE}/Since", request_serializer=pb.SinceRequest.SerializeToString
    )
    return call(pb.SinceRequest(session_id=session_id, seq=seq, follow=True), timeout=timeout)


def follow_events(stream: Iterator[bytes], count: int, limit: int = 1_000_000) -> list[bytes]:
    """Read a follow stream until it has delivered ``count`` events; their raw bytes."""
    events: list[bytes] = []
    caught_up = 0
    for _ in range(limit):
        if len(events) >= count:
            break
        rest, payloads = wire.split_field(next(stream), 1)
        events.extend(payloads)
        caught_up += pb.SinceResponse.FromString(rest).caught_up
    assert caught_up <= 1, f"{caught_up} caught_up responses"
    assert len(events) == count, f"wanted {count} events, got {len(events)}"
    return events


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (fraction in 0..1)."""
    ordered = sorted(values)
    assert ordered, "no values"
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered)) - 1))
    return ordered[rank]


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS and RssAnon of a process, in KiB (from /proc/PID/status)."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[name] = int(value.split()[0])
    return out
