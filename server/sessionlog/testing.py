"""Helpers for testing code that talks to sessionlog: a real server in a background thread.

    with running_server(tmp_path) as server:
        stub = server.stub()
        stub.Append(AppendRequest(session_id="s", events=[...]))

The server is the real thing (LMDB in the given folder, gRPC on 127.0.0.1, a free port); only
its event loop runs in a thread of the calling process so a synchronous test can drive it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from sessionlog.config import ServerConfig
from sessionlog.server import SessionLogServer
from sessionlog.storage.store import Store
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc


class ThreadedServer:
    """A SessionLogServer whose event loop runs in a daemon thread."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.server = SessionLogServer(config)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._channels: list[grpc.Channel] = []
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def store(self) -> Store:
        assert self.server.store is not None
        return self.server.store

    def run(self, coro: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def start(self) -> ThreadedServer:
        self._thread.start()
        self.port = self.run(self.server.start())
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        if self._thread.is_alive():
            self.run(self.server.stop(grace))
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()

    def channel(self) -> grpc.Channel:
        channel = grpc.insecure_channel(self.address)
        self._channels.append(channel)
        return channel

    def stub(self) -> pb_grpc.SessionLogServiceStub:
        return pb_grpc.SessionLogServiceStub(self.channel())  # type: ignore[no-untyped-call]


@contextmanager
def running_server(data_dir: str | Path, **config: Any) -> Iterator[ThreadedServer]:
    """A real server on 127.0.0.1 (free port) over LMDB in ``data_dir``; stopped on exit."""
    base = ServerConfig(data_dir=str(data_dir), listen="127.0.0.1:0")
    server = ThreadedServer(dataclasses.replace(base, **config)).start()
    try:
        yield server
    finally:
        server.stop()


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo detail of a failed call (AssertionError if there is not exactly one)."""
    status = rpc_status.from_call(error)
    assert status is not None, f"no rich status in {error!r}"
    infos = []
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            infos.append(info)
    assert len(infos) == 1, f"expected one ErrorInfo, got {len(infos)}"
    return infos[0]
