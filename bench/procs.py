"""Server subprocesses: start on a free 127.0.0.1 port, wait for health SERVING, stop by PID.

Both the sessionlog server and the echo server run as their own processes so that their CPU can
be read from /proc and neither shares an interpreter (or a GIL) with the load generator.

A sessionlog server is started with an explicit ``--workers`` (the server's default is one
worker per CPU, which would make the bench's figures depend on the machine's core count) and a
metrics endpoint, from which the cases read the writer's commits and group sizes. With more than
one worker the server is a process tree: a supervisor and its worker processes. Its CPU is then
the tree's (``tree_cpu_seconds``), and which worker holds which connection is read from /proc
(``connections_per_worker``): the kernel, not the bench, spreads connections over the workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from bench.common import process_cpu_seconds

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
START_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0
METRICS_TIMEOUT = 10.0
PUBLISH_SECONDS = 0.3
"""A little over how often each worker publishes its counts for the summed /metrics (0.25 s):
waited before a scrape of a server of several workers, so that it shows every worker's calls."""
WRITER_METRICS = (
    "sessionlog_commits_total",
    "sessionlog_syncs_total",
    "sessionlog_appended_events_total",
    "sessionlog_commit_group_size_sum",
    "sessionlog_commit_group_size_count",
    "sessionlog_commit_duration_seconds_sum",
    "sessionlog_commit_duration_seconds_count",
)
"""The writer's counts a case reads before and after its run (summed over the workers)."""
SETTLE_READS = 10
"""At most this many more reads of /metrics for its counts to settle."""


class ServerFailed(RuntimeError):
    """A server subprocess did not come up (its log tail is in the message)."""


def free_port() -> int:
    """A port nothing listens on right now (the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class ChildProcess:
    """A subprocess the bench started, with its output in ``log_path``: stopped by its PID."""

    process: subprocess.Popen[bytes] | None
    log_path: Path

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

    def cpu_seconds(self) -> float | None:
        """The process's CPU seconds so far."""
        return None if self.process is None else process_cpu_seconds(self.process.pid)


class ServerProcess(ChildProcess):
    """One server subprocess; ``address`` is where it listens once ``start`` returns."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int,
        log_path: Path,
        workers: int = 1,
        metrics_port: int = 0,
    ) -> None:
        self.name = name
        self.argv = argv
        self.port = port
        self.log_path = log_path
        self.workers = workers
        """Worker processes (1: the server is this one process)."""
        self.metrics_port = metrics_port
        """Where its Prometheus /metrics answers (0: not asked for)."""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def workers_suffix(self) -> str:
        """What a row's name adds for a server of several workers (nothing for one)."""
        return f", --workers {self.workers}" if self.workers > 1 else ""

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def cpu_seconds(self) -> float | None:
        """The server's CPU seconds so far: with workers, the supervisor's and all its workers'."""
        return None if self.process is None else tree_cpu_seconds(self.process.pid)

    def worker_pids(self) -> list[int]:
        """The processes that serve calls: the workers (by PID order), or the server itself."""
        if self.process is None:
            return []
        if self.workers == 1:
            return [self.process.pid]
        return sorted(children(self.process.pid))

    def connections_per_worker(self) -> list[int]:
        """Established TCP connections to the gRPC port held by each worker right now."""
        return [
            sum(c.local_port == self.port for c in tcp_connections(pid))
            for pid in self.worker_pids()
        ]

    def placement(self, client_pids: Sequence[int]) -> list[list[int]]:
        """For each client process, the workers (by index) that hold its connections to the
        gRPC port right now."""
        served = {
            c.remote_port: index
            for index, pid in enumerate(self.worker_pids())
            for c in tcp_connections(pid)
            if c.local_port == self.port
        }
        return [
            sorted(
                {
                    served[c.local_port]
                    for c in tcp_connections(pid)
                    if c.remote_port == self.port and c.local_port in served
                }
            )
            for pid in client_pids
        ]

    def writer_counts(self) -> dict[str, float]:
        """The writer's counts (``WRITER_METRICS``) from /metrics, summed over every worker,
        once they have settled (read again until two reads agree: a call still in flight, or a
        worker's counts not published yet, shows in a later read); empty when the server has
        no metrics endpoint. For the moments between load runs, when nothing writes."""
        if not self.metrics_port:
            return {}
        pause = PUBLISH_SECONDS if self.workers > 1 else 0.05
        counts = self._scrape()
        for _ in range(SETTLE_READS):
            time.sleep(pause)
            again = self._scrape()
            if again == counts:
                break
            counts = again
        return counts

    def _scrape(self) -> dict[str, float]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT) as reply:
            text = reply.read().decode()
        counts = dict.fromkeys(WRITER_METRICS, 0.0)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in counts:
                    counts[sample.name] += sample.value
        return counts

    def start(self) -> ServerProcess:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
            )
        try:
            wait_serving(self.address, self.process, START_TIMEOUT)
            self._wait_workers(START_TIMEOUT)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_workers(self, timeout: float) -> None:
        """Until every worker runs and listens on the port (the first one may answer health
        checks before the last has started: the kernel would give it every connection), or
        fail within ``timeout``."""
        deadline = time.monotonic() + timeout
        while len(self.worker_pids()) < self.workers or not all(
            self.port in listening_ports(pid) for pid in self.worker_pids()
        ):
            if time.monotonic() > deadline:
                raise ServerFailed(
                    f"server at {self.address}: {len(self.worker_pids())} of {self.workers} "
                    f"workers running after {timeout:.0f} s, not all listening"
                )
            time.sleep(0.05)


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


def children(pid: int) -> list[int]:
    """The PIDs whose parent is ``pid`` (from /proc/PID/stat, field 4)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone since the listing
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of a process and its children: its own, its reaped children's (cutime and
    cstime) and its live children's. A worker restarted meanwhile is still counted: once its
    parent reaps it, its CPU moves into the parent's cutime."""
    own = process_cpu_seconds(pid, children=True)
    if own is None:
        return None
    return own + sum(process_cpu_seconds(child) or 0.0 for child in children(pid))


@dataclass(frozen=True)
class Connection:
    """An established TCP connection on 127.0.0.1, by its two ports."""

    local_port: int
    remote_port: int


TCP_ESTABLISHED = "01"
"""The state column of /proc/net/tcp for an established connection."""
TCP_LISTEN = "0A"
"""... and for a listening socket."""


def listening_ports(pid: int) -> set[int]:
    """The TCP ports ``pid`` holds a listening socket on (empty when the process is gone)."""
    return {c.local_port for c in tcp_connections(pid, TCP_LISTEN)}


def tcp_connections(pid: int, state: str = "") -> list[Connection]:
    """The established TCP connections whose socket ``pid`` holds (from /proc/PID/fd and
    /proc/net/tcp; empty when the process is gone); its sockets in ``state`` when given."""
    state = state or TCP_ESTABLISHED
    fd_dir = Path(f"/proc/{pid}/fd")
    inodes = set()
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return []
    for name in names:
        try:
            link = os.readlink(fd_dir / name)
        except OSError:
            continue  # closed since the listing
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cells = line.split()  # sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if cells[3] == state and cells[9] in inodes:
                found.append(Connection(_port_of(cells[1]), _port_of(cells[2])))
    return found


def _port_of(address: str) -> int:
    """The port of an address as /proc/net/tcp spells it (``0100007F:1F90``)."""
    return int(address.rsplit(":", 1)[1], 16)


@contextlib.contextmanager
def running(
    name: str, argv_for_port: list[str], log_path: Path, workers: int = 1
) -> Iterator[ServerProcess]:
    """Start a server (``{port}`` and ``{metrics_port}`` in argv are replaced by free ports),
    stop it on exit."""
    attempts = 3
    for attempt in range(attempts):
        port, metrics_port = free_port(), free_port()
        argv = [
            arg.replace("{port}", str(port)).replace("{metrics_port}", str(metrics_port))
            for arg in argv_for_port
        ]
        uses_metrics = any("{metrics_port}" in arg for arg in argv_for_port)
        server = ServerProcess(
            name, argv, port, log_path, workers, metrics_port if uses_metrics else 0
        )
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
    *,
    workers: int,
) -> contextlib.AbstractContextManager[ServerProcess]:
    """``sessionlog serve --workers N`` over LMDB in ``data_dir`` (default durability: synced
    commits), with its metrics on a port of its own."""
    argv = [
        str(VENV_BIN / "sessionlog"),
        "serve",
        "--data",
        str(data_dir),
        "--listen",
        "127.0.0.1:{port}",
        "--metrics-listen",
        "127.0.0.1:{metrics_port}",
        "--workers",
        str(workers),
        "--log-level",
        "warning",
        *extra,
    ]
    return running("sessionlog", argv, log_path, workers)


def usable_cpus() -> int:
    """The CPUs this process may run on: what ``--workers auto`` would start."""
    return max(1, len(os.sched_getaffinity(0)))


def echo_server(log_path: Path) -> contextlib.AbstractContextManager[ServerProcess]:
    """The bare grpc.aio echo server of ``bench.echo``."""
    argv = [sys.executable, "-m", "bench.echo", "--listen", "127.0.0.1:{port}"]
    return running("echo", argv, log_path)
