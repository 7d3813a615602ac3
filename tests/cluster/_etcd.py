"""Real etcd processes for the cluster tests: Debian's etcd-server on free 127.0.0.1 ports,
a temp data dir, stopped by PID; restartable on the same ports and data.

    with EtcdProcess(tmp_path / "etcd") as server:      # started, ready
        server.endpoint                                   # Endpoint("127.0.0.1", port)
        server.stop(); server.start()                     # an etcd restart, data kept
        server.signal(signal.SIGSTOP)                     # a frozen etcd

Ready means ``/health`` answers ``{"health": "true"}`` (the single member elected itself and
serves). Without the ``etcd`` binary the tests that need it fail with the install hint: the
suite installs it (``make etcd-tools``), a skip would hide a missing step.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

import requests

from sessionlog.cluster.etcd import etcd_command
from sessionlog.cluster.settings import Endpoint
from tests.e2e._proc import free_port

READY_SECONDS = 30.0
STOP_SECONDS = 10.0
INSTALL = "etcd is not on PATH: `make etcd-tools` (or `apt-get install -y etcd-server`)"


class EtcdProcess:
    """One single-member etcd; ports chosen once, so a restart comes back where it was."""

    def __init__(self, directory: Path, name: str = "etcd") -> None:
        self.directory = directory
        self.name = name
        self.port = free_port()
        self.peer_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.port)

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.name}.log"

    @property
    def pid(self) -> int:
        assert self.process is not None, "not running"
        return self.process.pid

    def start(self) -> EtcdProcess:
        binary = shutil.which("etcd")
        assert binary is not None, INSTALL
        self.directory.mkdir(parents=True, exist_ok=True)
        argv, env = etcd_command(
            binary, self.name, self.directory / "data", self.port, self.peer_port
        )
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        self.starts += 1
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = READY_SECONDS) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"etcd exited with {self.process.returncode}:\n{self.log()}")
            try:
                reply = requests.get(f"http://127.0.0.1:{self.port}/health", timeout=1.0)
                if reply.ok and reply.json().get("health") == "true":
                    return
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.05)
        raise AssertionError(f"etcd not healthy within {timeout:.0f} s:\n{self.log()}")

    def signal(self, signum: int) -> None:
        """Send ``signum`` to this etcd's PID (nothing else)."""
        assert self.process is not None, "not started"
        assert self.process.poll() is None, "not running"
        os.kill(self.process.pid, signum)

    def stop(self) -> int | None:
        """SIGTERM by PID (SIGCONT first, in case it was frozen), wait, SIGKILL if stuck."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            os.kill(process.pid, signal.SIGTERM)
            try:
                return process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                return process.wait(STOP_SECONDS)
        return process.returncode

    def log(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> EtcdProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
