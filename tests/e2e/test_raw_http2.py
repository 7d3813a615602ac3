"""Garbage below gRPC: raw TCP and hand-built HTTP/2 frames sent to a `sessionlog serve` process.

Each case opens its own loopback connection to one server process and sends: random bytes; the
HTTP/2 preface followed by malformed frames; a valid gRPC Append whose 5-byte message prefix is
corrupted; or a stream cut off before it ends. The server may answer with GOAWAY, RST_STREAM, an
error status or by closing; what it must do is stay up, write nothing for any of it, and keep
serving normal calls. Frames are built by hand (HPACK literals without indexing or Huffman) so
there is no HTTP/2 library to install.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2

from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._proc import ServerProcess, free_port, health_status

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SESSION = "raw-h2"
APPEND_PATH = "/sessionlog.v1.SessionLogService/Append"
READ_SECONDS = 0.2


class Server:
    """The server process under test and the one session the raw requests aim at."""

    def __init__(self, proc: ServerProcess, port: int) -> None:
        self.proc = proc
        self.port = port
        self.address = f"127.0.0.1:{port}"

    def stub(self, channel: grpc.Channel) -> pb_grpc.SessionLogServiceStub:
        return pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]

    def event_count(self) -> int:
        with grpc.insecure_channel(self.address) as channel:
            reply = self.stub(channel).GetSession(pb.GetSessionRequest(session_id=SESSION))
        count: int = reply.session.event_count
        return count

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One `sessionlog serve` process for the module, with one event in SESSION."""
    folder = tmp_path_factory.mktemp("h2")
    port = free_port()
    address = f"127.0.0.1:{port}"
    with ServerProcess(["--data", str(folder / "data"), "--listen", address], cwd=folder) as proc:
        proc.wait_serving(address)
        running = Server(proc, port)
        append_normally(running, "before")
        yield running
        assert proc.stop() == 0, proc.log()


def append_normally(server: Server, content: str) -> int:
    """An ordinary Append through grpc; returns the seq it got."""
    event = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)
    event.data.update({"content": content})
    with grpc.insecure_channel(server.address) as channel:
        reply = server.stub(channel).Append(
            pb.AppendRequest(session_id=SESSION, events=[event]), timeout=10
        )
    seq: int = reply.events[0].seq
    return seq


# -- HTTP/2 by hand -----------------------------------------------------------------------------


def frame(kind: int, flags: int, stream: int, payload: bytes, length: int | None = None) -> bytes:
    """One frame; ``length`` may lie about the payload's size."""
    size = len(payload) if length is None else length
    return struct.pack(">I", size)[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def hpack_literal(name: str, value: str) -> bytes:
    """A literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2)."""

    def string(text: str) -> bytes:
        raw = text.encode()
        assert len(raw) < 127
        return bytes((len(raw),)) + raw

    return b"\x00" + string(name) + string(value)


def grpc_headers(port: int, path: str = APPEND_PATH) -> bytes:
    fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", f"127.0.0.1:{port}"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    return b"".join(hpack_literal(name, value) for name, value in fields)


def append_message() -> bytes:
    event = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)
    event.data.update({"content": "from a raw client"})
    request: bytes = pb.AppendRequest(session_id=SESSION, events=[event]).SerializeToString()
    return request


def opening() -> bytes:
    return PREFACE + frame(SETTINGS, 0, 0, b"")


def request_frames(port: int, body: bytes, end: bool = True) -> bytes:
    """HEADERS then one DATA frame carrying ``body`` (a gRPC length-prefixed message or not)."""
    headers = frame(HEADERS, END_HEADERS, 1, grpc_headers(port))
    return headers + frame(DATA, END_STREAM if end else 0, 1, body)


def prefixed(message: bytes, flag: int = 0, length: int | None = None) -> bytes:
    size = len(message) if length is None else length
    return bytes((flag,)) + struct.pack(">I", size) + message


def send_raw(server: Server, data: bytes, linger: float = READ_SECONDS) -> bytes:
    """Connect, send ``data``, read whatever comes back for ``linger`` seconds, close."""
    received = bytearray()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
        try:
            conn.sendall(data)
        except OSError:  # the server may hang up before it has read everything
            return bytes(received)
        deadline = time.monotonic() + linger
        conn.settimeout(0.05)
        while time.monotonic() < deadline and len(received) < 1 << 20:
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            received += chunk
    return bytes(received)


def frame_types(data: bytes) -> list[int]:
    """The types of the complete frames the server sent (its preface is a plain SETTINGS frame)."""
    kinds = []
    pos = 0
    while pos + 9 <= len(data):
        size = int.from_bytes(data[pos : pos + 3], "big")
        kinds.append(data[pos + 3])
        pos += 9 + size
    return kinds


def assert_healthy(server: Server, count_before: int) -> None:
    """Still SERVING, nothing written by the garbage, and a normal Append lands next."""
    assert server.proc.process is not None
    assert server.proc.process.poll() is None, f"server died:\n{server.proc.log()}"
    assert health_status(server.address, timeout=5) == health_pb2.HealthCheckResponse.SERVING
    assert server.event_count() == count_before, "garbage wrote an event"
    assert append_normally(server, "after") == count_before


# -- the cases ----------------------------------------------------------------------------------


def test_random_bytes(server: Server) -> None:
    """Random bytes instead of HTTP/2, short and long, are dropped without harm."""
    rng = random.Random(6)
    before = server.event_count()
    for size in (1, 7, 23, 24, 100, 4096, 70_000):
        send_raw(server, rng.randbytes(size), linger=0.1)
    send_raw(server, PREFACE[:10] + rng.randbytes(50), linger=0.1)
    send_raw(server, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", linger=0.1)
    assert_healthy(server, before)


GARBAGE_FRAMES = {
    "random-frames": b"",  # filled in by the test from a seeded generator
    "unknown-type": frame(0xFF, 0xFF, 1, b"\x00" * 10),
    "length-lies-long": frame(DATA, 0, 1, b"abc", length=10_000),
    "max-length": frame(DATA, 0, 1, b"x" * 100, length=(1 << 24) - 1),
    "data-on-stream-0": frame(DATA, END_STREAM, 0, b"abc"),
    "headers-bad-hpack": frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\xff\xff\xff\xff\x7f"),
    "headers-even-stream": frame(HEADERS, END_HEADERS, 2, hpack_literal(":method", "POST")),
    "continuation-alone": frame(CONTINUATION, END_HEADERS, 1, b"\x82"),
    "ping-wrong-size": frame(PING, 0, 0, b"\x00" * 3),
    "ping-on-stream": frame(PING, 0, 1, b"\x00" * 8),
    "settings-bad-values": frame(
        SETTINGS, 0, 0, struct.pack(">HI", 2, 7) + struct.pack(">HI", 4, 1 << 31)
    ),
    "settings-odd-size": frame(SETTINGS, 0, 0, b"\x00" * 5),
    "settings-ack-payload": frame(SETTINGS, ACK, 0, b"\x00" * 6),
    "window-update-zero": frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x00"),
    "window-update-overflow": frame(WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff") * 3,
    "rst-idle-stream": frame(RST_STREAM, 0, 9, b"\x00\x00\x00\x08"),
    "priority-self": frame(PRIORITY, 0, 3, b"\x00\x00\x00\x03\x10"),
    "push-promise": frame(PUSH_PROMISE, END_HEADERS, 1, b"\x00\x00\x00\x02"),
    "padded-too-much": frame(DATA, PADDED, 1, b"\xff" + b"x" * 4),
    "goaway-garbage": frame(GOAWAY, 0, 0, b"\xff" * 3),
    "headers-padded-priority": frame(
        HEADERS, PADDED | PRIORITY_FLAG | END_HEADERS, 1, b"\x40" + b"\x00" * 5
    ),
}


@pytest.mark.parametrize("case", sorted(GARBAGE_FRAMES))
def test_preface_then_garbage_frames(server: Server, case: str) -> None:
    """A valid preface followed by malformed or illegal frames harms nothing."""
    before = server.event_count()
    garbage = GARBAGE_FRAMES[case]
    if case == "random-frames":
        rng = random.Random(7)
        garbage = b"".join(
            frame(rng.randrange(12), rng.randrange(256), rng.randrange(8), rng.randbytes(20))
            for _ in range(40)
        )
    reply = send_raw(server, opening() + garbage)
    assert reply, "the server sent nothing back (not even its SETTINGS)"
    assert frame_types(reply)[0] == SETTINGS, "the server's first frame is not SETTINGS"
    assert_healthy(server, before)


def test_valid_request_is_answered(server: Server) -> None:
    """The hand-built request itself is right: sent intact, it appends one event."""
    before = server.event_count()
    reply = send_raw(server, opening() + request_frames(server.port, prefixed(append_message())))
    assert HEADERS in frame_types(reply)
    assert server.event_count() == before + 1


CORRUPT_PREFIXES: dict[str, Callable[[bytes], bytes]] = {
    "length-too-long": lambda m: prefixed(m, length=len(m) + 50),
    "length-too-short": lambda m: prefixed(m, length=len(m) - 5),
    "length-huge": lambda m: prefixed(m, length=0xFFFFFFFF),
    "length-zero": lambda m: prefixed(m, length=0),
    "compressed-flag": lambda m: prefixed(m, flag=1),
    "bad-flag": lambda m: prefixed(m, flag=0x7F),
    "prefix-cut": lambda m: b"\x00\x00\x01",
    "two-messages": lambda m: prefixed(m) + prefixed(m),
}


@pytest.mark.parametrize("case", sorted(CORRUPT_PREFIXES))
def test_grpc_request_with_corrupt_length_prefix(server: Server, case: str) -> None:
    """A gRPC Append whose message framing is corrupted is refused and writes nothing."""
    before = server.event_count()
    body = CORRUPT_PREFIXES[case](append_message())
    reply = send_raw(server, opening() + request_frames(server.port, body))
    assert reply, "no answer at all"
    written = server.event_count() - before
    # gRPC takes the first message of a unary call and ignores a second one: never both.
    assert written <= (1 if case == "two-messages" else 0), f"{written} events written"
    assert_healthy(server, before + written)


def test_truncated_streams(server: Server) -> None:
    """Streams cut off mid-headers or mid-message leave no trace.

    (A whole message whose stream is cut before END_STREAM may be written: like any dropped
    connection, the client cannot know, so that case is the crash test's "unknown outcome".)
    """
    before = server.event_count()
    whole = opening() + request_frames(server.port, prefixed(append_message()), end=False)
    for cut in (len(opening()) + 5, len(opening()) + 20, len(whole) - 10, len(whole) - 1):
        send_raw(server, whole[:cut], linger=0.05)
    headers_only = opening() + frame(HEADERS, 0, 1, grpc_headers(server.port)[:20])
    send_raw(server, headers_only, linger=0.05)
    assert_healthy(server, before)


def test_abandoned_streams_do_not_leak(server: Server) -> None:
    """Hundreds of half-sent requests on many connections: no fd leak once they are closed."""
    before_count = server.event_count()
    send_raw(server, opening(), linger=0.05)  # settle the fd count after a first connection
    fds_before = server.open_fds()
    partial = prefixed(append_message())[:-3]
    for _ in range(20):
        streams = b"".join(
            frame(HEADERS, END_HEADERS, sid, grpc_headers(server.port))
            + frame(DATA, 0, sid, partial)
            for sid in range(1, 40, 2)
        )
        send_raw(server, opening() + streams, linger=0.02)
    deadline = time.monotonic() + 10
    while server.open_fds() > fds_before + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.open_fds() <= fds_before + 2, "connections left open after the clients left"
    assert_healthy(server, before_count)


def test_server_survives_the_module(server: Server) -> None:
    """After all of it a fresh channel still gets SERVING and its append lands."""
    before = server.event_count()
    assert_healthy(server, before)
