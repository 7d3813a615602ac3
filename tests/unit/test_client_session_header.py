"""The Python clients (sync and asyncio) send ``x-session-id`` on every call that names a session.

A real gRPC server in the test records each call's metadata and refuses it (UNIMPLEMENTED, which
no client retries): what it records is what a proxy routing on the header would see.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from sessionlog.shard.slots import SESSION_HEADER
from sessionlog_client import AsyncClient, Client, SessionLogError, event
from sessionlog_client._common import session_header

SERVICE = "sessionlog.v1.SessionLogService"
TOKEN = "secret-token"
EXTRA = ("x-extra", "kept")


@dataclass
class Recorder(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Every call's method and metadata, each refused with UNIMPLEMENTED."""

    calls: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method.rsplit("/", 1)[-1]
        metadata = dict(details.invocation_metadata)
        with self.lock:
            self.calls.append((method, metadata))

        def refuse(request: bytes, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "recorded")

        if method == "Since":
            return grpc.unary_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)

    def take(self) -> list[tuple[str, dict[str, str]]]:
        with self.lock:
            calls, self.calls = self.calls, []
        return calls


@pytest.fixture(scope="module")
def recorder() -> Iterator[tuple[Recorder, str]]:
    handler = Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield handler, f"127.0.0.1:{port}"
    finally:
        server.stop(None)


SID = "sess-1"
SOURCE = "parent.2"
CALLS: list[tuple[str, str, Callable[[Any], Any]]] = [
    ("Append", SID, lambda c: c.append(SID, [event("user_message", {"content": "hi"})])),
    ("Since", SID, lambda c: c.since(SID, 3)),
    ("Since", SID, lambda c: c.follow(SID)),
    ("Surface", SID, lambda c: c.surface(SID)),
    ("DeriveMessages", SID, lambda c: c.derive_messages(SID, at_seq=2)),
    ("CreateSession", SID, lambda c: c.create_session(SID)),
    ("SeedSession", SID, lambda c: c.seed_session(SID, [{"role": "user", "content": "x"}])),
    ("GetSession", SID, lambda c: c.get_session(SID)),
    ("ForkSession", SOURCE, lambda c: c.fork_session(SOURCE, session_id="child")),
    ("AcquireLease", SID, lambda c: c.acquire_lease(SID, "w1", ttl=5)),
    ("RenewLease", SID, lambda c: c.renew_lease(SID, "w1")),
    ("ReleaseLease", SID, lambda c: c.release_lease(SID, "w1")),
    ("ListSessions", "", lambda c: c.list_sessions(prefix="s")),
]


def settle(result: Any) -> None:
    """Make the call happen: a stream or a page iterator calls when iterated."""
    if not hasattr(result, "DESCRIPTOR"):
        list(result)


async def settle_async(result: Any) -> None:
    if hasattr(result, "__aiter__"):
        async for _ in result:
            pass
    else:
        await result


def check(calls: list[tuple[str, dict[str, str]]], expected: list[tuple[str, str]]) -> None:
    assert [m for m, _ in calls] == [m for m, _ in expected]
    for (method, metadata), (_, session) in zip(calls, expected, strict=True):
        assert metadata.get(SESSION_HEADER, "") == session, method
        assert metadata["authorization"] == f"Bearer {TOKEN}", method  # kept
        assert metadata[EXTRA[0]] == EXTRA[1], method


def test_sync_client_names_the_session_of_every_call(recorder: tuple[Recorder, str]) -> None:
    handler, address = recorder
    handler.take()
    with Client(address, token=TOKEN, metadata=[EXTRA], timeout=5) as client:
        for _, _, call in CALLS:
            with pytest.raises(SessionLogError):
                settle(call(client))
    check(handler.take(), [(m, s) for m, s, _ in CALLS])


def test_async_client_names_the_session_of_every_call(recorder: tuple[Recorder, str]) -> None:
    handler, address = recorder
    handler.take()

    async def run() -> None:
        async with AsyncClient(address, token=TOKEN, metadata=[EXTRA], timeout=5) as client:
            for _, _, call in CALLS:
                with pytest.raises(SessionLogError):
                    await settle_async(call(client))

    asyncio.run(asyncio.wait_for(run(), 30))
    check(handler.take(), [(m, s) for m, s, _ in CALLS])


def test_a_non_ascii_id_is_percent_encoded() -> None:
    """gRPC metadata values are printable ASCII: an id of other letters goes as its UTF-8 bytes
    percent-encoded; the plain ids (A-Za-z0-9_.-) go as they are."""
    assert session_header("Abc_9.x-y") == "Abc_9.x-y"
    assert session_header("é-1") == "%C3%A9-1"


def test_a_non_ascii_id_arrives_percent_encoded(recorder: tuple[Recorder, str]) -> None:
    handler, address = recorder
    handler.take()
    with Client(address, timeout=5) as client, pytest.raises(SessionLogError):
        client.get_session("żółw")
    [(method, metadata)] = handler.take()
    assert (method, metadata[SESSION_HEADER]) == ("GetSession", "%C5%BC%C3%B3%C5%82w")
