"""The Python client (client/python, import sessionlog_client) against real servers.

Covers every RPC through Client and AsyncClient, errors as the server's own classes, follow that
resumes after a dropped connection and after a server restart (no gap, no duplicate), appends
retried with one request_id (never written twice), TLS with a bearer token, large replies, the
chat-format conversions, and the docs' client example (Clients page).

Dropped connections are real: a small TCP proxy on 127.0.0.1 between client and server cuts its
sockets on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

import sessionlog.errors as server_errors
import sessionlog_client
from sessionlog.testing import RunningServer
from sessionlog_client import (
    AsyncClient,
    Client,
    DeadlineExceeded,
    EventStream,
    Retry,
    errors,
    event,
    event_from_message,
    message_from_dict,
    message_to_dict,
)
from sessionlog_client.v1 import session_log_service_pb2 as pb
from sessionlog_client.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client.v1.event_pb2 import Event
from tests.e2e._proc import ServerProcess, free_port, running_server

ROOT = Path(__file__).resolve().parents[2]
FAST_RETRY = Retry(give_up_after=20.0, initial_backoff=0.02, max_backoff=0.2)


# -- helpers ---------------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    """Poll ``predicate`` every 10 ms; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


def users(*contents: str) -> list[Event]:
    return [event("user_message", {"content": c}) for c in contents]


class Follower:
    """A follow stream drained by a background thread into ``events``."""

    def __init__(self, stream: EventStream) -> None:
        self.stream = stream
        self.events: list[Event] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            for ev in self.stream:
                self.events.append(ev)
        except BaseException as exc:
            self.error = exc

    def seqs(self) -> list[int]:
        return [e.seq for e in self.events]

    def wait_for(self, count: int) -> None:
        wait_until(lambda: len(self.events) >= count or self.error is not None, what=f"{count}")
        assert self.error is None, f"follower failed: {self.error!r}"

    def ended(self, timeout: float = 10.0) -> bool:
        """Whether the stream ended by itself within ``timeout`` seconds."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        self.stream.close()
        self._thread.join(10)
        assert not self._thread.is_alive(), "follow stream did not stop on close()"
        assert self.error is None, f"follower failed: {self.error!r}"


class DropProxy:
    """A TCP proxy 127.0.0.1:port -> upstream that can cut every connection it carries."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.connections = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._cut_on_reply = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return  # listener closed
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            upstream.settimeout(None)
            with self._lock:
                self._pairs.append((downstream, upstream))
                self.connections += 1
            for src, dst, reply in ((downstream, upstream, False), (upstream, downstream, True)):
                threading.Thread(target=self._pump, args=(src, dst, reply), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, reply: bool) -> None:
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                break
            if not data:
                break
            if reply and self._cut_on_reply.is_set():
                self._cut_on_reply.clear()
                self.cut()
                return
            try:
                dst.sendall(data)
            except OSError:
                break
        for sock in (src, dst):
            _shut(sock)

    def cut(self) -> None:
        """Drop every open connection now (both sides see the socket close)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                _shut(sock)

    def cut_on_next_reply(self) -> None:
        """Drop the connections as soon as the server sends anything: the reply is lost."""
        self._cut_on_reply.set()

    def close(self) -> None:
        self._listener.close()
        self.cut()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@pytest.fixture
def proxy(server: RunningServer) -> Iterator[DropProxy]:
    """A cuttable proxy in front of the ``server`` fixture."""
    opened = DropProxy(server.port)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def client(server: RunningServer) -> Iterator[Client]:
    """A Client connected to the ``server`` fixture."""
    with Client(server.address, retry=FAST_RETRY) as opened:
        yield opened


# -- the log ---------------------------------------------------------------------------------------


def test_append_since_surface_and_messages_follow_the_spec_example(client: Client) -> None:
    """SPEC §4's third example through the client: 5 events stored, surface sys/[summary]/c."""
    first = client.append(
        "demo",
        [
            event("system_message", {"content": "sys"}),
            *users("a"),
            event("assistant_message", {"content": "b"}),
            *users("c"),
        ],
    )
    assert [e.seq for e in first.events] == [0, 1, 2, 3]
    summary = client.append(
        "demo",
        [{"type": "system_message", "data": {"content": "[summary]"}, "replace": [1, 2]}],
        expected_seq=4,
    )
    assert summary.next_seq == 5
    assert [e.seq for e in client.since("demo")] == [0, 1, 2, 3, 4]
    assert [e.seq for e in client.since("demo", 3)] == [3, 4]
    assert [e.seq for e in client.surface("demo").events] == [0, 4, 3]
    derived = client.derive_messages("demo")
    assert [m.content for m in derived.messages] == ["sys", "[summary]", "c"]
    assert list(derived.seqs) == [0, 4, 3]
    before = client.chat_messages("demo", at_seq=3)
    assert [(m["role"], m["content"]) for m in before] == [
        ("system", "sys"),
        ("user", "a"),
        ("assistant", "b"),
        ("user", "c"),
    ]


def test_errors_are_the_server_classes_with_their_metadata(client: Client) -> None:
    """A refusal raises the class named by its ErrorInfo reason, metadata kept, cause attached."""
    client.append("s", users("one"))
    with pytest.raises(errors.SeqConflict) as conflict:
        client.append("s", users("two"), expected_seq=0)
    assert conflict.value.reason == "SEQ_CONFLICT"
    assert conflict.value.metadata["next_seq"] == "1"
    assert isinstance(conflict.value.__cause__, grpc.RpcError)
    with pytest.raises(errors.InvalidSurfaceOp) as bad_op:
        client.append("s", [event("user_message", {}, replace=(5, 6))])
    assert isinstance(bad_op.value, errors.InvalidArgument)
    assert bad_op.value.metadata["index"] == "0"
    with pytest.raises(errors.InvalidSessionId):
        client.get_session("no spaces allowed")
    with pytest.raises(errors.BoundaryOutOfRange):
        client.surface("s", at_seq=9)
    assert [e.seq for e in client.since("s")] == [0], "refused appends wrote nothing"


def test_client_errors_module_mirrors_the_server_hierarchy() -> None:
    """sessionlog_client.errors has every server class: same names, reasons and bases."""

    def shape(module: Any) -> dict[str, tuple[str, list[str]]]:
        return {
            cls.__name__: (cls.reason, [b.__name__ for b in cls.__bases__])
            for cls in module.BY_REASON.values()
        }

    assert shape(errors) == shape(server_errors)
    assert len(shape(errors)) >= 25


@pytest.mark.serial  # a retry budget between 0.4 and 5 s
def test_server_gone_after_first_contact_is_retried_for_the_budget(tmp_path: Path) -> None:
    """A server that answered once and then went away: Unavailable only after retrying for
    about give_up_after seconds (it may be restarting)."""
    retry = Retry(give_up_after=0.5, initial_backoff=0.05, max_backoff=0.1)
    with running_server(tmp_path / "data") as running:
        client = Client(running.address, retry=retry, timeout=2)
        client.get_session("s")
    with client:
        started = time.monotonic()
        with pytest.raises(errors.Unavailable):
            client.append("s", users("lost"))
        assert 0.4 < time.monotonic() - started < 5


@pytest.mark.serial  # fails within 1 s
def test_wrong_address_fails_at_once_naming_it() -> None:
    """Nothing listening at the address: the first call, the first follow and the asyncio
    client's first call raise Unavailable within a second, the message naming the address."""
    address = f"127.0.0.1:{free_port()}"
    with Client(address) as client:
        for attempt in (lambda: client.get_session("s"), lambda: next(client.follow("s"))):
            started = time.monotonic()
            with pytest.raises(errors.Unavailable, match=f"cannot reach .* at {address}"):
                attempt()
            assert time.monotonic() - started < 1.0

    async def first_calls() -> None:
        async with AsyncClient(address) as aio:
            started = time.monotonic()
            with pytest.raises(errors.Unavailable, match=address):
                await aio.get_session("s")
            with pytest.raises(errors.Unavailable, match=address):
                await anext(aio.follow("s"))
            assert time.monotonic() - started < 1.0

    asyncio.run(first_calls())


@pytest.mark.serial  # a connect timeout between 0.4 and 3 s
def test_silent_address_fails_after_the_connect_timeout() -> None:
    """A port that accepts TCP but never speaks gRPC: the first call gives up after
    connect_timeout (not the 10 s call deadline), naming the address."""
    silent = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{silent.getsockname()[1]}"
    with silent, Client(address, connect_timeout=0.5) as client:
        started = time.monotonic()
        with pytest.raises(errors.Unavailable, match=f"cannot reach .* at {address}: .*timed out"):
            client.get_session("s")
        assert 0.4 < time.monotonic() - started < 3


def test_wait_for_ready_waits_for_a_server_that_starts_later(tmp_path: Path) -> None:
    """wait_for_ready=True: a call made before the server listens waits and succeeds once it
    is up, instead of failing fast."""
    address = f"127.0.0.1:{free_port()}"
    args = ["--data", str(tmp_path / "data"), "--listen", address]
    with Client(address, wait_for_ready=True, timeout=30) as client:
        result: dict[str, Any] = {}
        caller = threading.Thread(
            target=lambda: result.update(reply=client.get_session("late")), daemon=True
        )
        caller.start()
        time.sleep(0.5)
        assert caller.is_alive(), "the call should be waiting for the server"
        with ServerProcess(args, tmp_path) as late:
            late.wait_serving(address)
            caller.join(20)
    assert result["reply"].session.exists is False


@pytest.mark.serial  # fails within 5 s
def test_deadline_exceeded_is_its_own_class() -> None:
    """A server that never answers: the call's timeout raises DeadlineExceeded, no reason."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts TCP, never speaks HTTP/2
    with silent, Client(f"127.0.0.1:{silent.getsockname()[1]}") as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded) as late:
            client.get_session("s", timeout=0.3)
        assert time.monotonic() - started < 5
    assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert late.value.reason == "DEADLINE_EXCEEDED"
    assert isinstance(late.value, errors.SessionLogError)


# -- follow ----------------------------------------------------------------------------------------


def test_follow_delivers_stored_then_live_events_and_stops_on_close(client: Client) -> None:
    """follow yields stored events, flags caught_up, yields live ones, and close() ends it."""
    client.append("f", users("0", "1"))
    follower = Follower(client.follow("f"))
    follower.wait_for(2)
    wait_until(lambda: follower.stream.caught_up, what="caught_up")
    client.append("f", users("2"))
    client.append("f", users("3", "4"))
    follower.wait_for(5)
    follower.stop()
    assert follower.seqs() == [0, 1, 2, 3, 4]
    assert follower.stream.next_seq == 5
    assert follower.stream.closed


def test_follow_stops_on_break_and_on_client_close(server: RunningServer) -> None:
    """Breaking out of the loop ends the stream; closing the client ends streams still open."""
    with Client(server.address) as writer:
        writer.append("b", users("0", "1", "2"))
    reader = Client(server.address)
    with reader.follow("b", seq=1) as stream:
        for ev in stream:
            assert ev.seq == 1
            break
    assert stream.closed
    follower = Follower(reader.follow("b"))
    follower.wait_for(3)
    reader.close()
    assert follower.ended(), "closing the client left its follow stream open"
    assert follower.error is None
    assert follower.seqs() == [0, 1, 2]


def test_follow_resumes_after_a_dropped_connection(
    server: RunningServer, proxy: DropProxy, client: Client
) -> None:
    """Cutting the connection mid-stream: the follower reconnects from next_seq, no gap or dup."""
    with Client(proxy.address, retry=FAST_RETRY) as through_proxy:
        follower = Follower(through_proxy.follow("d"))
        client.append("d", users("0", "1", "2"))
        follower.wait_for(3)
        proxy.cut()
        client.append("d", users("3", "4"))
        client.append("d", users("5"))
        follower.wait_for(6)
        follower.stop()
    assert follower.seqs() == [0, 1, 2, 3, 4, 5]
    assert follower.stream.reconnects >= 1
    assert proxy.connections >= 2


def test_follow_survives_a_server_restart_without_gap_or_duplicate(tmp_path: Path) -> None:
    """SIGTERM the server mid-stream, start it again: follow goes on from where it was."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    args = ["--data", str(tmp_path / "data"), "--listen", address]
    first = ServerProcess(args, tmp_path, name="first").start()
    try:
        first.wait_serving(address)
        with Client(address, retry=FAST_RETRY) as client:
            follower = Follower(client.follow("r"))
            client.append("r", users("0", "1", "2"))
            follower.wait_for(3)
            assert first.stop() == 0
            with ServerProcess(args, tmp_path, name="second") as second:
                # The append retries on UNAVAILABLE until the new server answers.
                client.append("r", users("3"))
                second.wait_serving(address)
                client.append("r", users("4", "5"))
                follower.wait_for(6)
                follower.stop()
                assert [e.seq for e in client.since("r")] == [0, 1, 2, 3, 4, 5]
    finally:
        if first.process is not None and first.process.poll() is None:
            first.stop()
    assert follower.seqs() == [0, 1, 2, 3, 4, 5]
    assert [e.data["content"] for e in follower.events] == ["0", "1", "2", "3", "4", "5"]
    assert follower.stream.reconnects >= 1


def test_append_retried_after_a_lost_reply_writes_once(
    server: RunningServer, proxy: DropProxy, client: Client
) -> None:
    """The reply of a committed append is lost: the retry (same request_id) replays it."""
    with Client(proxy.address, retry=FAST_RETRY, timeout=5) as through_proxy:
        through_proxy.get_session("once")  # connect first, so the cut hits the append's reply
        proxy.cut_on_next_reply()
        reply = through_proxy.append("once", users("a", "b"))
    assert proxy.connections >= 2, "the append was not retried on a new connection"
    assert [e.seq for e in reply.events] == [0, 1]
    assert [e.seq for e in client.since("once")] == [0, 1], "the retry wrote a second copy"


def test_lifecycle_calls_retried_after_a_lost_reply_succeed_once(
    server: RunningServer, proxy: DropProxy, client: Client
) -> None:
    """Create, seed and fork lose their reply: the retry carries the request_id the client made,
    so it gets the first result instead of SESSION_ALREADY_EXISTS or a second fork child."""
    with Client(proxy.address, retry=FAST_RETRY, timeout=5) as through_proxy:
        through_proxy.get_session("lost")  # connect first, so the cut hits the reply
        proxy.cut_on_next_reply()
        created = through_proxy.create_session("lost-c", users("a", "b"))
        assert [e.seq for e in created.events] == [0, 1]
        proxy.cut_on_next_reply()
        seeded = through_proxy.seed_session("lost-s", [{"role": "user", "content": "hi"}])
        assert seeded.session.event_count == 1
        proxy.cut_on_next_reply()
        forked = through_proxy.fork_session("lost-c", at_seq=0)
    assert proxy.connections >= 4, "the calls were not retried on new connections"
    children = [
        s.session_id
        for page in client.list_sessions(page_size=100)
        for s in page.sessions
        if s.parent_session_id == "lost-c"
    ]
    assert children == [forked.session.session_id], "the retried fork made a second child"
    assert [e.seq for e in client.since("lost-c")] == [0, 1]


def test_lifecycle_calls_with_an_explicit_request_id(server: RunningServer, client: Client) -> None:
    first = client.create_session("rid-c", users("x"), request_id="c-1")
    again = client.create_session("rid-c", users("x"), request_id="c-1")
    assert again.SerializeToString() == first.SerializeToString()
    with pytest.raises(errors.RequestIdReused):
        client.create_session("rid-c", users("y"), request_id="c-1")
    fork = client.fork_session("rid-c", request_id="f-1")
    assert client.fork_session("rid-c", request_id="f-1").session == fork.session
    with pytest.raises(errors.SessionAlreadyExists):
        client.create_session("rid-c", users("x"), request_id="")

    async def scenario() -> tuple[str, str]:
        async with AsyncClient(server.address) as aio:
            one = await aio.fork_session("rid-c", request_id="f-2")
            two = await aio.fork_session("rid-c", request_id="f-2")
            return one.session.session_id, two.session.session_id

    one, two = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert one == two != fork.session.session_id


def test_appends_cancelled_by_their_callers_leave_the_server_writing(
    server: RunningServer, client: Client
) -> None:
    """Callers that give up on appends in flight (a dropped worker) do not stop later appends."""
    channel = grpc.insecure_channel(server.address)
    try:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        for i in range(40):
            request = pb.AppendRequest(session_id="gone", events=users(f"m{i}"))
            pending = stub.Append.future(request, timeout=10)
            time.sleep(0.0005 * (i % 4))
            pending.cancel()
    finally:
        channel.close()
    reply = client.append("after", users("still writing"), timeout=5)
    assert reply.next_seq == 1


def test_append_with_the_same_request_id_is_idempotent(client: Client) -> None:
    """An explicit request_id: a second append with it returns the first result, writes none."""
    first = client.append("idem", users("x"), request_id="req-1")
    again = client.append("idem", users("x"), request_id="req-1")
    assert again.next_seq == first.next_seq == 1
    with pytest.raises(errors.RequestIdReused):
        client.append("idem", users("other"), request_id="req-1")


# -- asyncio ---------------------------------------------------------------------------------------


def test_async_client_appends_reads_and_follows_across_a_drop(
    server: RunningServer, proxy: DropProxy
) -> None:
    """AsyncClient: every read, errors, and an async follow that resumes after a cut."""

    async def scenario() -> list[int]:
        async with (
            AsyncClient(server.address, retry=FAST_RETRY) as direct,
            AsyncClient(proxy.address, retry=FAST_RETRY) as through_proxy,
        ):
            await direct.append("a", users("0", "1"))
            with pytest.raises(errors.SeqConflict):
                await direct.append("a", users("x"), expected_seq=0)
            assert [m["content"] for m in await direct.chat_messages("a")] == ["0", "1"]
            assert len((await direct.surface("a")).events) == 2
            assert [e.seq async for e in direct.since("a", 1)] == [1]
            seen: list[int] = []
            async with through_proxy.follow("a") as stream:
                async for ev in stream:
                    seen.append(ev.seq)
                    if ev.seq == 1:
                        proxy.cut()
                        await direct.append("a", users("2"))
                    if ev.seq == 2:
                        await direct.append("a", users("3"))
                    if ev.seq == 3:
                        break
            assert stream.reconnects >= 1
            pages = [p async for p in direct.list_sessions(page_size=1)]
            assert [s.session_id for p in pages for s in p.sessions] == ["a"]
            assert (await direct.get_session("a")).session.event_count == 4
            return seen

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == [0, 1, 2, 3]


def test_since_batches_hold_the_events_one_at_a_time_reads(
    server: RunningServer, client: Client
) -> None:
    """batches() of a log longer than one response: the same events, in order, in more than
    one batch; from a seq on too (sync and async)."""
    big = "x" * 2000
    for _ in range(3):
        client.append("batches", users(*[big] * 100))
    whole = [e.seq for e in client.since("batches")]
    with client.since("batches") as stream:
        batches = [[e.seq for e in batch] for batch in stream.batches()]
    assert len(batches) > 1
    assert [seq for batch in batches for seq in batch] == whole == list(range(300))
    with client.since("batches", 250) as stream:
        assert [e.seq for b in stream.batches() for e in b] == list(range(250, 300))

    async def read() -> list[int]:
        async with AsyncClient(server.address) as aio, aio.since("batches", 5) as stream:
            return [e.seq async for batch in stream.batches() for e in batch]

    assert asyncio.run(asyncio.wait_for(read(), 60)) == list(range(5, 300))


def test_follow_batches_resume_after_a_dropped_connection(
    server: RunningServer, proxy: DropProxy, client: Client
) -> None:
    """A follow read a batch at a time: the cut connection is reopened from next_seq, with no
    event missed or repeated (async)."""

    async def scenario() -> list[int]:
        seen: list[int] = []
        async with (
            AsyncClient(proxy.address, retry=FAST_RETRY) as through_proxy,
            through_proxy.follow("fb") as stream,
        ):
            await asyncio.to_thread(client.append, "fb", users("0", "1"))
            async for batch in stream.batches():
                seen.extend(e.seq for e in batch)
                if seen[-1] == 1:
                    proxy.cut()
                    await asyncio.to_thread(client.append, "fb", users("2", "3"))
                if seen[-1] == 3:
                    break
            assert stream.reconnects >= 1
            assert stream.next_seq == 4
        return seen

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == [0, 1, 2, 3]


def test_async_follow_stops_when_cancelled(server: RunningServer) -> None:
    """cancel() from another task ends a pending async follow with no error."""

    async def scenario() -> list[int]:
        async with AsyncClient(server.address) as client:
            await client.append("c", users("0"))
            stream = client.follow("c")
            seen: list[int] = []

            async def drain() -> None:
                async for ev in stream:
                    seen.append(ev.seq)

            task = asyncio.create_task(drain())
            for _ in range(500):
                if seen:
                    break
                await asyncio.sleep(0.01)
            stream.cancel()
            await asyncio.wait_for(task, 10)
            return seen

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == [0]


def test_async_client_reads_the_replication_status_as_the_blocking_one(
    server: RunningServer, client: Client
) -> None:
    """replication_status is AsyncClient's too (the source Client's is generated from)."""

    async def read() -> str:
        async with AsyncClient(server.address) as asynchronous:
            reply = await asynchronous.replication_status()
            return reply.role

    assert asyncio.run(asyncio.wait_for(read(), 30)) == "primary"
    assert client.replication_status().role == "primary"


# -- sessions and leases ---------------------------------------------------------------------------


def test_lifecycle_rpcs(client: Client) -> None:
    """create, seed, get, list (pages), fork and the lease calls, with their refusals."""
    created = client.create_session("life-1", users("hello"))
    assert created.session.exists
    assert created.session.event_count == 1
    with pytest.raises(errors.SessionAlreadyExists):
        client.create_session("life-1")
    seeded = client.seed_session(
        "life-2", [{"role": "system", "content": "s"}, {"role": "robot", "content": "?"}]
    )
    assert seeded.session.event_count == 1
    assert [(d.index, d.reason) for d in seeded.drops] == [(1, "UNKNOWN_ROLE")]
    client.create_session("life-3")
    pages = list(client.list_sessions(prefix="life-", page_size=2))
    assert [len(p.sessions) for p in pages] == [2, 1]
    assert [s.session_id for p in pages for s in p.sessions] == ["life-1", "life-2", "life-3"]
    fork = client.fork_session("life-1", at_seq=0, session_id="life-1-fork")
    assert fork.session.parent_session_id == "life-1"
    assert not client.get_session("never").session.exists

    lease = client.acquire_lease("life-1", "worker-1", ttl=30).lease
    assert lease.holder == "worker-1"
    assert lease.token > 0
    with pytest.raises(errors.LeaseHeld):
        client.append("life-1", users("intruder"))
    client.append("life-1", users("mine"), lease_holder="worker-1", lease_token=lease.token)
    renewed = client.renew_lease("life-1", "worker-1", ttl=60).lease
    assert renewed.token == lease.token
    with pytest.raises(errors.LeaseLost):
        client.renew_lease("life-1", "worker-2")
    assert client.release_lease("life-1", "worker-1").released.token == lease.token
    assert not client.get_session("life-1").session.HasField("lease")


def test_replies_larger_than_grpc_default_are_accepted(tmp_path: Path) -> None:
    """A server allowing 8 MiB messages: a 4.5 MB surface reaches the client (not stock gRPC)."""
    big = "x" * 900_000
    with running_server(tmp_path / "data", max_message_bytes=8 << 20) as srv:
        with Client(srv.address) as client:
            client.append("big", [event("user_message", {"content": big}) for _ in range(5)])
            surface = client.surface("big")
            assert len(surface.events) == 5
            assert surface.ByteSize() > 4 << 20
        with grpc.insecure_channel(srv.address) as plain:
            stock = plain.unary_unary(
                "/sessionlog.v1.SessionLogService/Surface",
                request_serializer=pb.SurfaceRequest.SerializeToString,
                response_deserializer=pb.SurfaceResponse.FromString,
            )
            with pytest.raises(grpc.RpcError) as refused:
                stock(pb.SurfaceRequest(session_id="big"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


# -- TLS and the bearer token ----------------------------------------------------------------------


def _self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.crt"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "1", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    return key, cert


def test_tls_client_certificate_and_bearer_token(tmp_path: Path) -> None:
    """mTLS and tokens on the server: certificates plus a token work; no token or right fails."""
    server_key, server_cert = _self_signed(tmp_path, "localhost")
    client_key, client_cert = _self_signed(tmp_path, "worker")
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[token]]\nname = "worker"\ntoken = "s3cret-s3cret-s3cret"\n'
        'permissions = ["read", "write"]\n'
        '[[token]]\nname = "reader"\ntoken = "r3ader-r3ader-r3ader"\npermissions = ["read"]\n'
    )
    with running_server(
        tmp_path / "data",
        tls_cert=str(server_cert),
        tls_key=str(server_key),
        tls_client_ca=str(client_cert),
        auth_tokens=str(tokens),
    ) as srv:

        def connect(token: str | None) -> Client:
            return Client(
                srv.address,
                root_certificates=server_cert,
                private_key=client_key,
                certificate_chain=client_cert.read_bytes(),
                token=token,
                retry=Retry(give_up_after=0.5),
            )

        with connect("s3cret-s3cret-s3cret") as client:
            client.append("tls", users("over TLS"))
            with client.follow("tls") as stream:
                assert next(stream).data["content"] == "over TLS"
        with connect("r3ader-r3ader-r3ader") as reader:
            assert reader.get_session("tls").session.event_count == 1
            with pytest.raises(errors.PermissionDenied):
                reader.append("tls", users("not allowed"))
        with connect(None) as anonymous, pytest.raises(errors.Unauthenticated):
            anonymous.get_session("tls")
        without_cert = Client(
            srv.address,
            root_certificates=server_cert,
            token="s3cret",
            retry=Retry(give_up_after=0.2),
        )
        with without_cert, pytest.raises(errors.Unavailable):
            without_cert.get_session("tls", timeout=5)


# -- chat format -----------------------------------------------------------------------------------


def test_chat_dicts_round_trip_through_messages_and_the_server(client: Client) -> None:
    """OpenAI-format dicts -> seed -> derive -> dicts gives the input back, field for field."""
    chat: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"},
    ]
    for message in chat:
        assert message_to_dict(message_from_dict(message)) == message
    client.seed_session("chat", chat)
    assert client.chat_messages("chat") == chat
    client.append("chat", [event_from_message({"role": "assistant", "content": "done"})])
    assert client.chat_messages("chat")[-1] == {"role": "assistant", "content": "done"}
    extra = client.chat_messages("chat", extra=True)[1]
    assert extra["metadata"]["content_parts"][0] == {"type": "text", "text": "look"}
    assert extra["created_at"].tzinfo is not None


def test_event_helpers_build_what_the_server_expects() -> None:
    """event() and event_from_dict() name types three ways; an unknown type is a ValueError."""
    for name in ("tool_result", "TOOL_RESULT", "EVENT_TYPE_TOOL_RESULT"):
        assert sessionlog_client.event_type(name) == sessionlog_client.EventType.Value(
            "EVENT_TYPE_TOOL_RESULT"
        )
    built = sessionlog_client.event_from_dict(
        {"type": "system_message", "data": {"n": 1}, "time": "2026-01-02T03:04:05.123456Z"}
    )
    as_dict = sessionlog_client.event_to_dict(built)
    assert as_dict["data"] == {"n": 1}
    assert as_dict["time"].microsecond == 123456
    with pytest.raises(ValueError, match="unknown event type"):
        event("chat_message")


# -- packaging and docs ----------------------------------------------------------------------------


def test_client_installs_without_the_server() -> None:
    """The client needs grpcio and protobuf only; importing it loads neither lmdb nor sessionlog."""
    project = tomllib.loads((ROOT / "client" / "python" / "pyproject.toml").read_text())
    names = {re.split(r"[<>=~!\[ ]", d)[0] for d in project["project"]["dependencies"]}
    assert names == {"grpcio", "grpcio-status", "protobuf", "googleapis-common-protos"}
    probe = (
        "import sys, sessionlog_client as c; c.Client('127.0.0.1:1').close(); "
        "bad = [m for m in sys.modules if m == 'lmdb' or m.split('.')[0] == 'sessionlog']; "
        "print(bad)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.strip() == "[]"


def readme_block(language: str, marker: str) -> str:
    """The first ```language block of the docs' Clients page that contains ``marker``."""
    page = (ROOT / "docs" / "getting-started" / "clients.md").read_text()
    for block in re.findall(rf"```{language}\n(.*?)```", page, flags=re.DOTALL):
        if marker in block:
            return str(block)
    raise AssertionError(
        f"no ```{language} block with {marker!r} in docs/getting-started/clients.md"
    )


def test_readme_python_client_example_runs_as_written(server: RunningServer) -> None:
    """The Clients page's Python client example, run as a script against a real server, works."""
    code = readme_block("python", "sessionlog_client")
    lines = [line for line in code.strip().splitlines() if not line.startswith("# ->")]
    assert len(lines) <= 10  # a 10-line client; its expected output (`# -> ...`) aside
    code = code.replace("127.0.0.1:50051", server.address)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "system Be brief.",
        "user What is LMDB?",
        "assistant A memory-mapped B+tree store.",
    ]


def test_incremental_derive_through_the_client(server: RunningServer) -> None:
    """derive_messages(known=earlier) returns only the messages added since."""
    with Client(server.address) as client:
        client.append("inc", [event("user_message", {"content": "one"})])
        first = client.derive_messages("inc")
        client.append("inc", [event("assistant_message", {"content": "two"})])
        tail = client.derive_messages("inc", known=first)
        assert tail.incremental
        assert [m.content for m in tail.messages] == ["two"]


def test_a_listing_with_state_past_the_message_limit_reads_smaller_pages(
    server: RunningServer,
) -> None:
    """Sessions whose states together pass the client's message limit are all listed with
    their state: a page too large is asked again with fewer sessions, from the same token."""
    with Client(server.address, retry=FAST_RETRY, max_message_bytes=1 << 20) as small:
        for n in range(12):
            held = Event(type="EVENT_TYPE_STEP_END")
            held.state_delta.update({"big": f"{n}" + "x" * 100_000})
            small.append(f"big.{n:02}", [held])
        listed = [
            (s.session_id, s.state.fields["big"].string_value[:3])
            for page in small.list_sessions(prefix="big.", with_state=True)
            for s in page.sessions
        ]
        assert listed == [(f"big.{n:02}", f"{n}xx"[:3]) for n in range(12)]
