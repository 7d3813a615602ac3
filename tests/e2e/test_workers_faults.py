"""`sessionlog serve --workers N` under faults, and the semantics that must hold across workers.

Real servers on 127.0.0.1 (see test_workers). Calls are pinned to a chosen worker: a channel
is opened until /proc shows the kernel gave its connection to that worker's process. Faults
are real signals and a real LMDB writer in another process; every loop is bounded.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._proc import free_port, run_cli
from tests.e2e.test_workers import Workers, workers

SECONDS = 20.0
"""Every wait and loop below gives up after this long."""


def _server_side(port: int) -> dict[int, str]:
    """The established connections to ``port``, server side: {client port: socket inode}."""
    found: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            local = int(fields[1].rsplit(":", 1)[1], 16)
            if local == port and fields[3] == "01":
                found[int(fields[2].rsplit(":", 1)[1], 16)] = fields[9]
    return found


def _sockets_of(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def channel_on(server: Workers, pid: int, tries: int = 80) -> grpc.Channel:
    """A channel whose connection the kernel gave to worker ``pid`` (one call made on it)."""
    for _ in range(tries):
        before = set(_server_side(server.port))
        channel = grpc.insecure_channel(
            server.address, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        stub.Surface(pb.SurfaceRequest(session_id="pin"), timeout=10)
        after = _server_side(server.port)
        new = [inode for client, inode in after.items() if client not in before]
        if len(new) == 1 and new[0] in _sockets_of(pid):
            return channel
        channel.close()
    raise AssertionError(f"no connection reached worker {pid} in {tries} tries")


def stubs_by_worker(server: Workers) -> list[pb_grpc.SessionLogServiceStub]:
    return [
        pb_grpc.SessionLogServiceStub(channel_on(server, pid))  # type: ignore[no-untyped-call]
        for pid in server.pids()
    ]


# -- ports --------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", ["1", "2"])
@pytest.mark.parametrize(
    ("flag", "host"),
    [
        ("--http-listen", "127.0.0.1"),
        ("--metrics-listen", "127.0.0.1"),
        ("--http-listen", "0.0.0.0"),  # a wildcard covering the gRPC address
    ],
)
def test_two_addresses_of_one_server_on_one_port_are_refused(
    tmp_path: Path, count: str, flag: str, host: str
) -> None:
    """The web console or metrics on the gRPC port is refused with one line, by one worker or
    several alike. (Several used to start "serving" with every gRPC call failing: the reserved
    port's probes let the second address in, and the workers' SO_REUSEPORT sockets then split
    the port between gRPC and HTTP.)"""
    port = free_port()
    result = run_cli(
        [
            "serve",
            "--data",
            str(tmp_path / "d"),
            "--listen",
            f"127.0.0.1:{port}",
            flag,
            f"{host}:{port}",
            "--workers",
            count,
        ],
        tmp_path,
    )
    assert result.returncode == 1, result.stderr
    assert f"cannot listen on {host}:{port} ({flag})" in result.stderr
    assert "Traceback" not in result.stderr


def test_each_address_given_port_0_gets_its_own_port(tmp_path: Path) -> None:
    """Port 0 for gRPC, the console (127.0.0.1) and metrics (localhost: IPv4 and IPv6): the
    kernel picks three different ports, and the console and metrics answer on theirs."""
    with workers(
        tmp_path, 2, "--http-listen", "127.0.0.1:0", "--metrics-listen", "localhost:0"
    ) as server:
        line = server.serving_line()
        http, metrics = line["http"], line["metrics"]
        ports = {server.port, int(http.rsplit(":", 1)[1]), int(metrics.rsplit(":", 1)[1])}
        assert len(ports) == 3, line
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as reply:
            assert b"sessionlog_info" in reply.read()
        with urllib.request.urlopen(f"http://{http}/", timeout=10) as reply:
            assert reply.status == 200


# -- what the supervisor reports ----------------------------------------------------------------


def test_a_worker_killed_while_starting_is_reported_as_killed(tmp_path: Path) -> None:
    """Six times, SIGKILL a worker and then its replacement as soon as it is made: each
    failed restart is logged as ended by SIGKILL (asyncio used to say "code 255" now and then,
    and warn of an unknown child: the supervisor's signalling had reaped it first), and the
    supervisor ends with two serving workers."""
    rounds = 6
    with workers(tmp_path, 2) as server:
        for done in range(rounds):
            serving = server.pids()
            os.kill(serving[0], signal.SIGKILL)
            starting: list[int] = []
            deadline = time.monotonic() + SECONDS
            while not starting and time.monotonic() < deadline:  # no sleep: catch it early
                starting = [pid for pid in server.pids() if pid not in serving]
            assert starting, "no replacement started"
            os.kill(starting[0], signal.SIGKILL)
            server.wait_log("worker restarted", count=done + 1, timeout=60)
        retried = [
            e for e in server.lines() if e["message"] == "worker could not restart; trying again"
        ]
        assert len(retried) == rounds, server.process.log()
        hows = [e["error"].rsplit(": it ended with ", 1)[1] for e in retried]
        assert hows == ["signal SIGKILL before serving"] * rounds
        assert "Unknown child process" not in server.process.log()
        assert len(server.pids()) == 2
        assert server.process.stop() == 0
