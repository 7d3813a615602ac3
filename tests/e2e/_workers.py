"""Helpers for the tests of `sessionlog serve --workers N`: a running server of several
processes, what its log says, and calls pinned to one worker (a channel is opened until /proc
shows that the kernel gave its connection to that worker's process)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._proc import ServerProcess, free_port


class Workers:
    """A running `serve --workers N` and what its log says about it."""

    def __init__(self, process: ServerProcess, address: str, data: Path) -> None:
        self.process = process
        self.address = address
        self.port = int(address.rsplit(":", 1)[1])
        self.data = data

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.process.log().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def serving_line(self) -> dict[str, Any]:
        return next(e for e in self.lines() if e["message"] == "sessionlog serving")

    def pids(self) -> list[int]:
        """The current workers' PIDs: the supervisor's children."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in children.read_text().split()]

    def wait_log(self, message: str, count: int = 1, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(1 for e in self.lines() if e["message"] == message) >= count:
                return
            time.sleep(0.05)
        raise AssertionError(f"no {count} x {message!r} in the log:\n{self.process.log()}")


@contextmanager
def workers(tmp_path: Path, count: int = 2, *flags: str, name: str = "a") -> Iterator[Workers]:
    address = f"127.0.0.1:{free_port()}"
    data = tmp_path / f"data-{name}"
    args = ["--data", str(data), "--listen", address, "--workers", str(count)]
    with ServerProcess([*args, "--log-format", "json", *flags], tmp_path, name=name) as process:
        running = Workers(process, address, data)
        running.wait_log("sessionlog serving")
        process.wait_serving(address)
        yield running


def established(port: int) -> dict[int, str]:
    """The established connections to ``port``, server side: {client port: socket inode}."""
    found: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            local = int(fields[1].rsplit(":", 1)[1], 16)
            if local == port and fields[3] == "01":
                found[int(fields[2].rsplit(":", 1)[1], 16)] = fields[9]
    return found


def sockets_of(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def connections_by_worker(pids: list[int], port: int) -> Counter[int]:
    """How many established TCP connections on ``port`` each process holds (from /proc)."""
    owner = {inode: pid for pid in pids for inode in sockets_of(pid)}
    return Counter(owner[inode] for inode in established(port).values() if inode in owner)


def channel_on(server: Workers, pid: int, tries: int = 80) -> grpc.Channel:
    """A channel whose connection the kernel gave to worker ``pid`` (one call made on it)."""
    for _ in range(tries):
        before = set(established(server.port))
        channel = grpc.insecure_channel(
            server.address, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        stub.Surface(pb.SurfaceRequest(session_id="pin"), timeout=10)
        after = established(server.port)
        new = [inode for client, inode in after.items() if client not in before]
        if len(new) == 1 and new[0] in sockets_of(pid):
            return channel
        channel.close()
    raise AssertionError(f"no connection reached worker {pid} in {tries} tries")


def stubs_by_worker(server: Workers) -> list[pb_grpc.SessionLogServiceStub]:
    return [
        pb_grpc.SessionLogServiceStub(channel_on(server, pid))  # type: ignore[no-untyped-call]
        for pid in server.pids()
    ]
