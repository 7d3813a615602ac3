"""Helpers for testing code that talks to sessionlog: a real server, in a thread or a process.

    with running_server(tmp_path) as server:
        stub = server.stub()
        stub.Append(AppendRequest(session_id="s", events=[...]))

    with server_process(tmp_path, workers=2) as server:   # `sessionlog serve --workers 2`
        ...

Either way the server is the real thing (LMDB in the given folder, gRPC on 127.0.0.1, a free
port). ``running_server`` runs its event loop in a thread of the calling process, so a test can
also reach inside it (its store, its loop); ``server_process`` starts `sessionlog serve` as a
child process, the way an operator does, so that a test sees what several worker processes
sharing one folder and one port do. Both give the ``RunningServer`` interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from sessionlog.config import ServerConfig, flags_of
from sessionlog.server import SessionLogServer
from sessionlog.storage.store import Store
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc


class RunningServer(Protocol):
    """What a test may use of a running server, in a thread or in a process."""

    config: ServerConfig
    """What it was started with (``listen`` as given: port 0 stays 0 here)."""
    port: int
    """The bound gRPC port."""

    @property
    def address(self) -> str:
        """127.0.0.1:PORT."""

    @property
    def http_port(self) -> int:
        """The web console's bound port (0: off)."""

    @property
    def metrics_port(self) -> int:
        """The metrics endpoint's bound port (0: off)."""

    def channel(self) -> grpc.Channel:
        """A new insecure channel to the server, closed when the server stops."""

    def stub(self) -> pb_grpc.SessionLogServiceStub:
        """A SessionLogService client on a new channel."""

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving: in-flight calls get ``grace`` seconds, follow streams end."""


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
    def http_port(self) -> int:
        return self.server.http_port

    @property
    def metrics_port(self) -> int:
        return self.server.metrics_port

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


READY_SECONDS = 90.0
"""How long a server process may take to serve (its supervisor gives each worker 60 s)."""
KILL_AFTER_GRACE_SECONDS = 15.0
"""How long past its shutdown grace a server process may take to exit before it is killed."""


class ProcessServer:
    """`sessionlog serve --workers N` in a child process, with the ``RunningServer`` interface.

    The process gets the configuration as flags (``config.flags_of``) and none of this
    process's SESSIONLOG_* variables; it logs JSON lines to ``log_path``. It is ready when its
    supervisor logs "sessionlog serving", which it does once every worker serves; that line
    also gives the ports the supervisor bound for port 0. A test cannot reach inside it: what
    it knows of the server, it learns over the API, from the log, or from the data folder once
    the server has stopped.
    """

    def __init__(self, config: ServerConfig, workers: int, log_path: Path) -> None:
        if workers < 2:
            raise ValueError(f"a server process here runs 2 or more workers, not {workers}")
        self.config = config
        self.workers = workers
        self.log_path = log_path
        self.port = 0
        self._http_port = self._metrics_port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._channels: list[grpc.Channel] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http_port(self) -> int:
        return self._http_port

    @property
    def metrics_port(self) -> int:
        return self._metrics_port

    @property
    def pid(self) -> int:
        assert self._process is not None, "not started"
        return self._process.pid

    def command(self) -> list[str]:
        config = dataclasses.replace(self.config, workers=self.workers, log_format="json")
        return [sys.executable, "-m", "sessionlog.cli", "serve", *flags_of(config)]

    def start(self, timeout: float = READY_SECONDS) -> ProcessServer:
        """Start the process and wait until every worker serves; RuntimeError if it does not."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONLOG_")}
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                self.command(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            serving = [e for e in self.log_entries() if e.get("message") == "sessionlog serving"]
            if serving:
                self._ready(serving[0])
                return self
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"sessionlog serve exited with {self._process.returncode} before serving:\n"
                    + self.log()
                )
            time.sleep(0.05)
        self._end(signal.SIGKILL, KILL_AFTER_GRACE_SECONDS)
        raise RuntimeError(f"sessionlog serve did not serve within {timeout}s:\n{self.log()}")

    def _ready(self, entry: dict[str, Any]) -> None:
        self.port = int(entry["port"])
        for name in ("http", "metrics"):
            address = str(entry.get(name, "off"))
            port = 0 if address == "off" else int(address.rpartition(":")[2])
            setattr(self, f"_{name}_port", port)

    def log(self) -> str:
        """Everything the server has logged so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_entries(self) -> list[dict[str, Any]]:
        """The server's log lines that are JSON objects, parsed, oldest first."""
        entries = []
        for line in self.log().splitlines():
            if line.startswith("{"):
                try:
                    entries.append(json.loads(line))
                except ValueError:  # a line the process is still writing
                    continue
        return entries

    def channel(self) -> grpc.Channel:
        channel = grpc.insecure_channel(self.address)
        self._channels.append(channel)
        return channel

    def stub(self) -> pb_grpc.SessionLogServiceStub:
        return pb_grpc.SessionLogServiceStub(self.channel())  # type: ignore[no-untyped-call]

    def stop(self, grace: float | None = 1.0) -> None:
        """SIGTERM, then wait for the drain. The process drains for the shutdown grace it was
        started with (``server_process`` gives it 1 second unless told otherwise), whatever
        ``grace`` says. RuntimeError if it exits uncleanly or a worker died while it served."""
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        if self._process is None or self._process.poll() is not None:
            return
        code = self._end(
            signal.SIGTERM, self.config.shutdown_grace_seconds + KILL_AFTER_GRACE_SECONDS
        )
        died = [e for e in self.log_entries() if e.get("message") == "worker exited; restarting it"]
        if code != 0 or died:
            raise RuntimeError(
                f"sessionlog serve (pid {self.pid}) exited with {code}"
                + (f" after {len(died)} worker deaths" if died else "")
                + f":\n{self.log()}"
            )

    def kill(self) -> None:
        """SIGKILL the supervisor (its workers die with it) and reap it: a crash."""
        self._end(signal.SIGKILL, KILL_AFTER_GRACE_SECONDS)

    def _end(self, signum: int, timeout: float) -> int:
        assert self._process is not None, "not started"
        if self._process.poll() is None:
            os.kill(self._process.pid, signum)
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout)
            raise RuntimeError(
                f"sessionlog serve (pid {self.pid}) did not exit within {timeout}s; killed:\n"
                + self.log()
            ) from None


@contextmanager
def server_process(
    data_dir: str | Path, workers: int = 2, **config: Any
) -> Iterator[ProcessServer]:
    """`sessionlog serve --workers N` on 127.0.0.1 (a free port) over LMDB in ``data_dir``,
    given ``config`` (ServerConfig's field names, as for ``running_server``); its log goes
    beside ``data_dir``. Stopped on exit (SIGTERM, 1 second of grace unless told otherwise)."""
    folder = Path(data_dir)
    folder.parent.mkdir(parents=True, exist_ok=True)
    base = ServerConfig(data_dir=str(folder), listen="127.0.0.1:0", shutdown_grace_seconds=1.0)
    log_path = folder.parent / f"{folder.name}-server-{time.monotonic_ns()}.log"
    server = ProcessServer(dataclasses.replace(base, **config), workers, log_path).start()
    try:
        yield server
    except BaseException:
        with contextlib.suppress(RuntimeError):  # the test's own failure is the one to see
            server.stop()
        raise
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
