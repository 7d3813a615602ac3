"""Real `sessionlog serve` child processes for e2e tests: free ports, readiness, stop by PID.

A server process writes its stdout and stderr to a log file (never a pipe, which could fill
and block it). Readiness is the standard gRPC health check answering SERVING. Stopping sends
SIGTERM to the child's PID and waits; SIGKILL only if it does not exit in time.

Every server a test starts follows the mode under test (``workers_under_test``): processes
started here get SESSIONLOG_WORKERS, and ``running_server`` (behind the ``server`` fixture)
is an in-process server or `sessionlog serve --workers N` processes.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sessionlog import testing
from sessionlog.cli import main
from sessionlog.testing import RunningServer

BIN_DIR = Path(sys.prefix) / "bin"
SESSIONLOG = BIN_DIR / "sessionlog"
GRPCURL = BIN_DIR / "grpcurl"

READY_SECONDS = 60.0
"""How long a started server may take to serve: the wait polls its health (and fails at once if
it exits), so a generous deadline costs a passing test nothing. 20 s was overrun at load 12-15
(three of 65 tests of five e2e modules in one -n 2 run, without `make test`'s bytecode cache):
the servers had not logged a line yet."""
STOP_SECONDS = 10.0


def _below_the_ephemeral_ports() -> range:
    """Ports below Linux's ephemeral range, which no bind to port 0 and no outgoing connection
    is handed (where the range leaves room for them)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    below = range(max(10_000, low - 12_000), low)
    # a range that starts low (1024 65535 in some containers) leaves too few: take 10000-32767
    return below if len(below) >= 1_000 else range(10_000, 32_768)


_PORTS = random.Random()


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago, picked at random below the ephemeral
    range. A port from a bind to port 0 is free again once the probe closes, and the next bind
    to port 0 anywhere on the machine may be handed it before the server this port is meant for
    binds it (a member's --metrics-listen port went to a relay's listener that way, and the
    member could not start). Below that range only another pick like this one can take it."""
    ports = _below_the_ephemeral_ports()
    for _ in range(200):
        port = _PORTS.choice(ports)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError(f"no free port on 127.0.0.1 in {ports.start}-{ports.stop - 1}")


def _descendants(pid: int) -> list[int]:
    """The PIDs of ``pid``'s children, theirs, and so on (Linux's /proc/PID/task/*/children)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            with contextlib.suppress(OSError):
                children = [int(child) for child in (task / "children").read_text().split()]
                found += children
                todo += children
    return found


def _gone(pid: int) -> bool:
    """Exited (no longer in /proc, or a zombie, which holds no file)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def free_ports_in_a_row(count: int) -> int:
    """The first of ``count`` consecutive ports on 127.0.0.1 that were free a moment ago, for a
    command that takes one port and uses the next ones too, below the ephemeral range as
    ``free_port``'s."""
    ports = _below_the_ephemeral_ports()
    for _ in range(200):
        base = _PORTS.randrange(ports.start, ports.stop - count)
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + count):
                    probe = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError(f"no {count} free ports in a row below {ports.stop}")


def workers_under_test() -> int:
    """How many worker processes the servers that tests start run (``serve --workers``): 1
    unless SESSIONLOG_TEST_WORKERS (or pytest's ``--workers``, which sets it) says otherwise;
    ``make test-workers`` runs the e2e tests marked ``workers`` with 2. Read at each call: the
    option is applied after this module may have been imported."""
    text = os.environ.get("SESSIONLOG_TEST_WORKERS", "1")
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"SESSIONLOG_TEST_WORKERS must be a whole number from 1, not {text!r}")
    return int(text)


@contextmanager
def running_server(data_dir: Path, **config: Any) -> Iterator[RunningServer]:
    """A real server over ``data_dir`` given ``config`` (ServerConfig's fields), in the mode
    under test: in this process (``sessionlog.testing.running_server``), or, when
    ``workers_under_test()`` is 2 or more, `sessionlog serve --workers N` processes
    (``sessionlog.testing.server_process``). A replica runs in one process whatever the mode
    (``config.worker_count``), so it runs in this one. A test that needs the in-process
    server's insides uses ``sessionlog.testing.running_server`` itself and is marked
    ``in_process``."""
    workers = workers_under_test()
    if workers == 1 or config.get("replica_of"):
        with testing.running_server(data_dir, **config) as threaded:
            yield threaded
    else:
        with testing.server_process(data_dir, workers, **config) as process:
            yield process


def clean_env(*, workers: bool = True, **variables: str) -> dict[str, str]:
    """This process's environment without any SESSIONLOG_* variable, plus (unless not
    ``workers``) SESSIONLOG_WORKERS=workers_under_test() (a test's own --workers flag wins over it),
    plus ``variables``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONLOG_")}
    if workers:
        env["SESSIONLOG_WORKERS"] = str(workers_under_test())
    env.update(variables)
    return env


def run_cli(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run `sessionlog ARGS` to completion and capture its output."""
    return subprocess.run(
        [str(SESSIONLOG), *args],
        cwd=cwd,
        env=clean_env(workers="--replica-of" not in args) if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_cli_here(
    args: list[str], *, stdin: str | None = None, **variables: str
) -> subprocess.CompletedProcess[str]:
    """`sessionlog ARGS` run in this process through the same ``main``, for a test of a client
    command's parsing and output (a process costs about a second of imports): its stdout,
    stderr and exit code as ``run_cli`` gives them. As in ``run_cli``'s child, no SESSIONLOG_*
    variable of this process is seen, only ``variables``; ``stdin`` is what it reads from stdin.
    Call it from the main thread (the client commands set a SIGINT handler)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("SESSIONLOG_")}
    stdout, stderr = io.StringIO(), io.StringIO()
    given_stdin = sys.stdin
    try:
        if stdin is not None:
            sys.stdin = io.StringIO(stdin)
        for name in saved:
            del os.environ[name]
        os.environ.update(variables)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(args)
            except SystemExit as stop:  # argparse's usage errors and --help
                code = stop.code if isinstance(stop.code, int) else 1
    finally:
        sys.stdin = given_stdin
        for name in variables:
            os.environ.pop(name, None)
        os.environ.update(saved)
    return subprocess.CompletedProcess(
        ["sessionlog", *args], code, stdout.getvalue(), stderr.getvalue()
    )


def health_status(address: str, timeout: float = 1.0) -> int | None:
    """The overall health status at ``address``, or None when nothing answers."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return None
    status: int = reply.status
    return status


def _ack_of(args: list[str]) -> list[str]:
    """The values given to --ack in ``args`` (as separate arguments)."""
    return [value for flag, value in itertools.pairwise(args) if flag == "--ack"]


class ServerProcess:
    """`sessionlog serve ARGS` in ``cwd``; use as a context manager so it always stops."""

    def __init__(
        self, args: list[str], cwd: Path, env: dict[str, str] | None = None, name: str = "server"
    ) -> None:
        self.args = ["serve", *args]
        self.cwd = cwd
        # A replica, and a primary with --ack replica, run in one process and refuse
        # SESSIONLOG_WORKERS above 1.
        one = "--replica-of" in args or "--ack=replica" in args or "replica" in _ack_of(args)
        self.env = clean_env(workers=not one) if env is None else env
        self.log_path = cwd / f"{name}-{time.monotonic_ns()}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [str(SESSIONLOG), *self.args],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_serving(self, address: str, timeout: float = READY_SECONDS) -> None:
        """Poll the health service at ``address`` until SERVING; fail if the process dies."""
        assert self.process is not None, "not started"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"server exited with {self.process.returncode} before serving:\n{self.log()}"
                )
            if health_status(address, timeout=0.5) == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.05)
        raise AssertionError(f"server not SERVING at {address} within {timeout}s:\n{self.log()}")

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the child's PID (nothing else is signalled)."""
        assert self.process is not None, "not started"
        if self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def wait(self, timeout: float = STOP_SECONDS) -> int:
        """Wait for exit; on timeout SIGKILL it and fail."""
        assert self.process is not None, "not started"
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_SECONDS)
            raise AssertionError(
                f"server pid {self.pid} did not exit within {timeout}s; killed:\n{self.log()}"
            ) from None

    def stop(self, timeout: float = STOP_SECONDS) -> int:
        """SIGTERM, then wait (SIGKILL if stuck). Returns the exit code."""
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> int:
        """SIGKILL (a crash) and reap; with ``--workers N``, also wait until the workers are gone
        (they die with their supervisor, PR_SET_PDEATHSIG, a moment after it, and hold the data
        folder's lock until then: a restart at once found the folder in use)."""
        assert self.process is not None, "not started"
        workers = _descendants(self.process.pid) if self.process.poll() is None else []
        self.signal(signal.SIGKILL)
        code = self.wait()
        deadline = time.monotonic() + STOP_SECONDS
        while not all(_gone(pid) for pid in workers):
            if time.monotonic() > deadline:
                raise AssertionError(f"workers {workers} outlived their killed supervisor")
            time.sleep(0.01)
        return code

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self.stop()
        except AssertionError:
            if exc is None:
                raise
