"""A compiled load client for the unary cases: h2load, from Debian's nghttp2-client.

A Python gRPC client spends about as much CPU per call as the Python server does, so on a small
machine 16 Python clients saturate before the server they measure. h2load is C: with it, nearly
all the CPU a unary case uses is the server's. Its rows stand next to the Python client's rows,
which stay (they are what a Python agent worker sees).

How it runs: one h2load process per client (``-c1 -m1``: one connection, one call in flight; the
etcd Put beside case 13's AppendStream row keeps more in flight, ``UnaryLoad.in_flight``), each
POSTing its own gRPC frame (the very request the Python client sends: client i appends to its own
session), all started together and each reaped by its PID:

1. warm-up: ``warmup`` seconds (``-D``) per process, untimed (connections, the server's code paths);
2. measured: ``duration`` seconds per process, each writing a per-request log (``--log-file``:
   start in µs, HTTP status, µs to the end of the response), which gives p50/p99.

The rate is the calls h2load counts as succeeded, over the measured duration it reports. The
cpu cli column is the CPU of the h2load processes (user + system, from ``wait4``'s rusage when each
is reaped); the server's and the machine's CPU are read over the same window, from the start of
the processes to the last exit.

What is checked. h2load sees HTTP, not gRPC: a gRPC error is an HTTP 200 whose trailers carry a
non-zero grpc-status, which h2load does not read. So every h2load process must exit 0 and succeed
at least once, report no failed, errored or timed-out request and log only status 200; and for
sessionlog the caller checks the stored events (``cases.run_append_h2load``): each client's
session must grow during the measured run by its succeeded calls, or by one call more (the call in
flight when h2load stops at the end of its duration is stored but not counted), times the events
per call. The warm-up is a run of its own, before the sessions are read, so that its calls (which
h2load does not count) stay out of that sum; hence no ``--warm-up-time``. The echo server returns
the request; its replies are checked by status only. etcd's writes are checked the same way
against its revision (``bench.etcd``). A read whose every reply is the same bytes is checked by
what h2load received (``check_replies``): whole replies for the calls it counted, since an error
reply carries no message.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.common import Measurement, system_cpu_seconds
from bench.load import ServerCpu, UnaryLoad

GRACE_SECONDS = 30.0
"""How long past its duration an h2load process may take to exit before it is killed."""
POLL_SECONDS = 0.02
INSTALL = "install it with `apt-get install -y nghttp2-client` (or `make bench-tools` as root)"


def executable() -> str | None:
    return shutil.which("h2load")


def unavailable() -> str:
    """Why the h2load rows cannot run here, or "" when they can."""
    if executable() is None:
        return f"h2load was not found on PATH; {INSTALL}"
    return ""


def version() -> str:
    """What ``h2load --version`` says, e.g. "h2load nghttp2/1.52.0"; "" when it cannot say."""
    return version_line(executable())


def version_line(path: str | None) -> str:
    """The first line ``PATH --version`` prints; "" when there is no such program or it fails."""
    if path is None:
        return ""
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = done.stdout.strip().splitlines()
    return lines[0] if lines else ""


@dataclass
class H2Outcome:
    measurement: Measurement
    succeeded: dict[int, int] = field(default_factory=dict)
    """Client index -> the calls h2load counted as succeeded in the measured run."""
    data_bytes: dict[int, int] = field(default_factory=dict)
    """Client index -> the bytes of DATA (the gRPC message frames of the replies) it received."""


@dataclass
class _Run:
    """What one h2load process did."""

    exit_code: int
    cpu_seconds: float
    output: str
    log: list[str]


def frame(message: bytes) -> bytes:
    """A gRPC length-prefixed message: uncompressed flag, 4-byte big-endian length, the bytes."""
    return b"\0" + len(message).to_bytes(4, "big") + message


def warm_up(load: UnaryLoad, work: Path) -> None:
    """Run every client for ``load.warmup`` seconds and check it succeeded; nothing is kept."""
    if load.warmup <= 0:
        return
    runs, _ = _run_all(replace(load, duration=load.warmup), work, "warmup", log=False)
    for index, run in enumerate(runs):
        problem = _problem(run, _counts(run.output))
        if problem:
            raise RuntimeError(f"h2load warm-up of client {index} failed: {problem}")


def measure(
    load: UnaryLoad,
    name: str,
    server_cpu: ServerCpu,
    work: Path,
    midway: Callable[[], None] | None = None,
) -> H2Outcome:
    """The measured run: every client for ``load.duration`` seconds, started together.

    ``midway`` is called once, from a timer thread, half way through the run (while every
    client holds its connection): to look at the server under the load."""
    timer = None if midway is None else threading.Timer(load.duration / 2, midway)
    cpu_before, system_before = server_cpu(), system_cpu_seconds()
    if timer is not None:
        timer.start()
    try:
        runs, window = _run_all(load, work, "measure", log=True)
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()
    cpu_after, system_after = server_cpu(), system_cpu_seconds()
    measurement = Measurement(
        name=name,
        events=0,
        calls=0,
        seconds=load.duration,
        client_cpu_seconds=sum(run.cpu_seconds for run in runs),
        server_cpu_seconds=_delta(cpu_before, cpu_after),
        system_cpu_seconds=_delta(system_before, system_after),
        window_seconds=window,
        client_processes=len(runs),
    )
    outcome = H2Outcome(measurement)
    latencies: list[float] = []
    finished: list[float] = []
    for index, run in enumerate(runs):
        counts = _counts(run.output)
        outcome.succeeded[index] = counts.get("succeeded", 0)
        outcome.data_bytes[index] = _data_bytes(run.output)
        problem = _problem(run, counts)
        statuses = [line.split("\t") for line in run.log if line.strip()]
        bad = [fields[1] for fields in statuses if len(fields) < 3 or fields[1] != "200"]
        if bad and not problem:
            problem = f"{len(bad)} responses with HTTP status {bad[0]}"
        if problem:
            measurement.errors += 1
            measurement.first_error = measurement.first_error or f"client {index}: {problem}"
        latencies.extend(int(fields[2]) / 1000 for fields in statuses if len(fields) >= 3)
        seconds = _finished_seconds(run.output)
        if seconds is not None:
            finished.append(seconds)
    measurement.calls = sum(outcome.succeeded.values())
    measurement.events = measurement.calls * load.events_per_call
    measurement.seconds = max(finished, default=load.duration)
    measurement.set_latencies(latencies)
    measurement.details.update(
        load_client="h2load",
        clients=len(load.requests),
        events_per_call=load.events_per_call,
        request_bytes=len(load.requests[0]),
        succeeded_per_client=[outcome.succeeded[i] for i in sorted(outcome.succeeded)],
    )
    return outcome


def _run_all(load: UnaryLoad, work: Path, phase: str, log: bool) -> tuple[list[_Run], float]:
    """Start one h2load per client, reap each by PID; the runs, and the wall time from the
    first start to the last exit."""
    path = executable()
    if path is None:
        raise RuntimeError(unavailable())
    directory = work / "h2load"
    directory.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9]+", "-", f"{load.target}{load.method}").strip("-")
    url = f"http://{load.target}{load.method}"
    duration = f"{max(1, round(load.duration * 1000))}ms"
    processes: list[subprocess.Popen[bytes]] = []
    files: list[tuple[Path, Path]] = []
    started = time.perf_counter()
    try:
        for index, request in enumerate(load.requests):
            body = directory / f"{stem}-{index}.body"
            body.write_bytes(frame(request))
            out, log_path = (directory / f"{stem}-{phase}-{index}.{ext}" for ext in ("out", "tsv"))
            log_path.unlink(missing_ok=True)
            argv = [
                path, "-c1", f"-m{load.in_flight}", "-D", duration, "-d", str(body),
                "-H", "content-type: application/grpc", "-H", "te: trailers",
                *(["-H", load.headers[index]] if load.headers else []),
                *(["--log-file", str(log_path)] if log else []),
                url,
            ]  # fmt: skip
            files.append((out, log_path))
            with out.open("wb") as output:
                processes.append(
                    subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=output,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        usage = _reap(processes, started + load.duration + GRACE_SECONDS)
        ended = time.perf_counter()
    finally:
        _kill_running(processes)
    runs = []
    for process, (out, log_path) in zip(processes, files, strict=True):
        runs.append(
            _Run(
                exit_code=process.returncode,
                cpu_seconds=usage[process.pid],
                output=out.read_text(errors="replace"),
                log=log_path.read_text().splitlines() if log and log_path.exists() else [],
            )
        )
    return runs, ended - started


def _reap(processes: list[subprocess.Popen[bytes]], deadline: float) -> dict[int, float]:
    """Wait for every process (by PID, polling until ``deadline``); each one's CPU seconds.

    ``wait4`` reaps a process and returns its rusage; the Popen is told its exit code.
    """
    cpu: dict[int, float] = {}
    pending = {process.pid: process for process in processes}
    while pending:
        for pid, process in list(pending.items()):
            done, status, rusage = os.wait4(pid, os.WNOHANG)
            if done == pid:
                process.returncode = os.waitstatus_to_exitcode(status)
                cpu[pid] = rusage.ru_utime + rusage.ru_stime
                del pending[pid]
        if not pending:
            break
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{len(pending)} h2load process(es) still running past the deadline")
        time.sleep(POLL_SECONDS)
    return cpu


def _kill_running(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL, by PID, any h2load process not reaped yet, then reap it."""
    for process in processes:
        if process.returncode is None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)


REQUESTS = re.compile(
    r"requests: (?P<total>\d+) total, (?P<started>\d+) started, (?P<done>\d+) done, "
    r"(?P<succeeded>\d+) succeeded, (?P<failed>\d+) failed, (?P<errored>\d+) errored, "
    r"(?P<timeout>\d+) timeout"
)
TRAFFIC = re.compile(r"traffic: .*, [\d.]+\w*B \((?P<data>\d+)\) data")
FINISHED = re.compile(r"finished in (?P<value>[\d.]+)(?P<unit>us|ms|s),")
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def check_replies(outcome: H2Outcome, reply_bytes: int) -> None:
    """For a load whose every reply is the same ``reply_bytes`` of gRPC message frames: each
    client must have received whole replies for the calls h2load counted as succeeded, or up to
    one reply more (the call in flight at the stop). A gRPC error is an HTTP 200 whose reply has
    no message (or another one), so it shows as missing bytes; each such client is an error."""
    measurement = outcome.measurement
    for index, received in sorted(outcome.data_bytes.items()):
        counted = outcome.succeeded.get(index, 0)
        if not counted * reply_bytes <= received <= (counted + 1) * reply_bytes:
            measurement.errors += 1
            measurement.first_error = measurement.first_error or (
                f"client {index}: received {received} bytes of replies for {counted} calls "
                f"counted as succeeded, of {reply_bytes} bytes each (a gRPC error is an HTTP 200)"
            )
    measurement.details.update(
        reply_bytes=reply_bytes,
        received_bytes_per_client=[outcome.data_bytes[i] for i in sorted(outcome.data_bytes)],
    )


def _counts(output: str) -> dict[str, int]:
    found = REQUESTS.search(output)
    return {} if found is None else {k: int(v) for k, v in found.groupdict().items()}


def _data_bytes(output: str) -> int:
    found = TRAFFIC.search(output)
    return 0 if found is None else int(found["data"])


def _finished_seconds(output: str) -> float | None:
    found = FINISHED.search(output)
    return None if found is None else float(found["value"]) * UNITS[found["unit"]]


def _problem(run: _Run, counts: dict[str, int]) -> str:
    """Why one h2load run failed, or ""."""
    tail = " | ".join(run.output.strip().splitlines()[-3:])
    if run.exit_code != 0:
        return f"h2load exited with {run.exit_code}: {tail}"
    if not counts:
        return f"no request summary in h2load's output: {tail}"
    bad = {k: counts[k] for k in ("failed", "errored", "timeout") if counts[k]}
    if bad:
        return "requests " + ", ".join(f"{v} {k}" for k, v in bad.items())
    if counts["succeeded"] == 0:
        return f"no request succeeded (is the server up?): {tail}"
    return ""


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before
