"""Server subprocesses: start on a free 127.0.0.1 port, wait for health SERVING, stop by PID.

Both the sessionlog server and the echo server run as their own processes so that their CPU can
be read from /proc and neither shares an interpreter (or a GIL) with the load generator.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.common import process_cpu_seconds

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
START_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0


class ServerFailed(RuntimeError):
    """A server subprocess did not come up (its log tail is in the message)."""


def free_port() -> int:
    """A port nothing listens on right now (the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class ServerProcess:
    """One server subprocess; ``address`` is where it listens once ``start`` returns."""

    def __init__(self, name: str, argv: list[str], port: int, log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def cpu_seconds(self) -> float | None:
        return None if self.process is None else process_cpu_seconds(self.process.pid)

    def start(self) -> ServerProcess:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
            )
        try:
            wait_serving(self.address, self.process, START_TIMEOUT)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> int | None:
        """SIGTERM by PID, wait, SIGKILL if it does not go. Returns the exit code."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                return process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                return process.wait(STOP_TIMEOUT)
        return process.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def wait_serving(address: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    """Poll the standard health service until it answers SERVING, or fail within ``timeout``."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ServerFailed(f"server at {address} exited with {process.returncode}")
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            except grpc.RpcError:
                time.sleep(0.05)
                continue
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.05)
    raise ServerFailed(f"server at {address} not SERVING within {timeout:.0f} s")


@contextlib.contextmanager
def running(name: str, argv_for_port: list[str], log_path: Path) -> Iterator[ServerProcess]:
    """Start a server (``{port}`` in argv is replaced by a free port), stop it on exit."""
    attempts = 3
    for attempt in range(attempts):
        port = free_port()
        argv = [arg.replace("{port}", str(port)) for arg in argv_for_port]
        server = ServerProcess(name, argv, port, log_path)
        try:
            server.start()
            break
        except ServerFailed as exc:
            if attempt == attempts - 1:
                raise ServerFailed(f"{name}: {exc}\n{server.log_tail()}") from None
    try:
        yield server
    finally:
        code = server.stop()
        if code not in (0, None):
            print(f"warning: {name} exited with {code}:\n{server.log_tail()}", file=sys.stderr)


def sessionlog_server(
    data_dir: Path,
    log_path: Path,
    extra: Sequence[str] = (),
) -> contextlib.AbstractContextManager[ServerProcess]:
    """``sessionlog serve`` over LMDB in ``data_dir`` (default durability: synced commits)."""
    argv = [
        str(VENV_BIN / "sessionlog"),
        "serve",
        "--data",
        str(data_dir),
        "--listen",
        "127.0.0.1:{port}",
        "--log-level",
        "warning",
        *extra,
    ]
    return running("sessionlog", argv, log_path)


def echo_server(log_path: Path) -> contextlib.AbstractContextManager[ServerProcess]:
    """The bare grpc.aio echo server of ``bench.echo``."""
    argv = [sys.executable, "-m", "bench.echo", "--listen", "127.0.0.1:{port}"]
    return running("echo", argv, log_path)
