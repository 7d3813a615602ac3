"""The compiled load client for appends over AppendStream (and unary Append): bench/go/appendload.

h2load sends one fixed request per client and cannot speak a bidirectional stream, and a Python
client spends as much CPU per append as the server does. ``appendload`` is Go: N streams, each to
its own session over a connection of its own, each keeping up to W appends in flight (or N unary
callers, one call in flight each), for a duration or a count; it prints one JSON line (appends
and events per second, p50/p99 per append from send to its answer, errors, the events each
session was acknowledged). It is built here, offline, in GOPATH mode over Debian's Go packages
(``make go-tools``), as tests/e2e/test_client_go.py builds client/go: a copy of client/go and of
bench/go/appendload in a temp GOPATH beside /usr/share/gocode; Go's build cache makes the build
after the first take seconds.

How a row runs: an untimed warm-up invocation (``settings.warmup`` seconds: connections, the
server's code paths), then the sessions' next seqs are read, then the measured invocation, during
which the server's CPU, the machine's and (midway) the connections each worker holds are read;
the client's CPU is the process's rusage when it is reaped. What is checked: the program reports
no error and at least one append per client, and every session grew over the measured run by
exactly the events acknowledged to it (appendload waits for every answer before it exits, so
nothing is in flight at the end, unlike h2load's last call).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.cases import next_seq
from bench.common import Measurement, Settings, append_request, system_cpu_seconds, writer_figures
from bench.procs import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUILD = ROOT / "bench" / "results" / "go"
"""Where ``python -m bench.appendload`` builds (git-ignored, as every bench result)."""
MODULE = "github.com/sessionlog/sessionlog"
DEBIAN_GOPATH = Path("/usr/share/gocode")
BUILD_SECONDS = 300.0
GRACE_SECONDS = 60.0
"""How long past its duration appendload may take to answer everything and exit."""
INSTALL = "run `make go-tools` as root (Debian's golang-go and golang-google-*-dev packages)"


def unavailable() -> str:
    """Why appendload cannot be built here, or "" when it can."""
    if shutil.which("go") is None:
        return f"go was not found on PATH; {INSTALL}"
    if not (DEBIAN_GOPATH / "src" / "google.golang.org" / "grpc").is_dir():
        return f"Debian's Go gRPC package is missing from {DEBIAN_GOPATH}; {INSTALL}"
    return ""


def go_env(gopath: Path) -> dict[str, str]:
    """GOPATH mode over ``gopath`` and Debian's tree: nothing is downloaded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GO", "SESSIONLOG_"))}
    env.update(
        GO111MODULE="off",
        GOPATH=f"{gopath}:{DEBIAN_GOPATH}",
        GOPROXY="off",
        GOTOOLCHAIN="local",
        GOFLAGS="",
    )
    if not (env.get("HOME") or env.get("XDG_CACHE_HOME")):
        env["GOCACHE"] = str(gopath / "cache")
    return env


def build(work: Path) -> Path:
    """Build appendload in ``work`` and return the binary's path (RuntimeError if it fails)."""
    missing = unavailable()
    if missing:
        raise RuntimeError(missing)
    gopath = work / "gopath"
    tree = gopath / "src" / MODULE
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(ROOT / "client" / "go", tree / "client" / "go")
    shutil.copytree(ROOT / "bench" / "go", tree / "bench" / "go")
    binary = work / "appendload"
    package = tree / "bench" / "go" / "appendload"
    done = subprocess.run(
        [shutil.which("go") or "go", "build", "-o", str(binary), "."],
        cwd=package,
        env={**go_env(gopath), "PWD": str(package)},
        capture_output=True,
        text=True,
        timeout=BUILD_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"building bench/go/appendload failed ({INSTALL}):\n{done.stderr}")
    return binary


@dataclass(frozen=True)
class LoadCase:
    """``clients`` streams (or unary callers), each to its own session, ``window`` appends in
    flight per stream (1 for unary), ``events_per_append`` events each."""

    mode: str
    """"stream" (AppendStream) or "unary" (Append)."""
    clients: int
    window: int
    events_per_append: int
    session_prefix: str = ""
    """Session ids are ``<prefix>-<client index>``; empty: one of the case's own."""

    @property
    def label(self) -> str:
        events = f"{self.events_per_append} ev"
        if self.mode == "unary":
            plural = "s" if self.clients > 1 else ""
            return f"Append {events}, {self.clients} unary caller{plural}"
        return f"AppendStream {events}, {self.clients} streams x {self.window} in flight"

    @property
    def prefix(self) -> str:
        """Session ids of this case are ``<prefix>-<client index>``."""
        return self.session_prefix or f"al-{self.mode}-{self.events_per_append}"


@dataclass
class _Run:
    report: dict[str, Any]
    cpu_seconds: float
    wall_seconds: float
    output: str


def _invoke(
    binary: Path, server: ServerProcess, case: LoadCase, duration: float, work: Path
) -> _Run:
    """Run appendload once, reap it by PID; its JSON report and its CPU (rusage)."""
    request = work / f"appendload-{case.events_per_append}.request"
    request.write_bytes(append_request("template", case.events_per_append))
    argv = [
        str(binary),
        "-addr", server.address,
        "-mode", case.mode,
        "-streams", str(case.clients),
        "-window", str(case.window),
        "-events", str(case.events_per_append),
        "-duration", f"{max(1, round(duration * 1000))}ms",
        "-prefix", case.prefix,
        "-request", str(request),
    ]  # fmt: skip
    out = work / f"appendload-{case.mode}-{case.events_per_append}.out"
    started = time.perf_counter()
    with out.open("wb") as output:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT
        )
    deadline = started + duration + GRACE_SECONDS
    try:
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid == process.pid:
                process.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() > deadline:
                raise RuntimeError(f"appendload still running {GRACE_SECONDS:.0f} s past its end")
            time.sleep(0.02)
    finally:
        if process.returncode is None:
            process.kill()
            process.wait(5)
    wall = time.perf_counter() - started
    text = out.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"appendload exited with {process.returncode}: {text.strip()[-600:]}")
    return _Run(json.loads(lines[-1]), usage.ru_utime + usage.ru_stime, wall, text)


def run(
    binary: Path, settings: Settings, server: ServerProcess, case: LoadCase, work: Path
) -> Measurement:
    """One row: warm up, measure, then check every session grew by what was acknowledged."""
    if settings.warmup > 0:
        warm = _invoke(binary, server, case, settings.warmup, work)
        if warm.report["errors"]:
            raise RuntimeError(f"appendload warm-up failed: {warm.report['first_error']}")
    sessions = [f"{case.prefix}-{i}" for i in range(case.clients)]
    with grpc.insecure_channel(server.address) as channel:
        before = [next_seq(channel, session) for session in sessions]
    spread: list[list[int]] = []
    stop = threading.Event()

    def look() -> None:
        """The connections each worker holds, once every client's is there (appendload dials
        them all before it sends); else the fullest count seen while it ran."""
        best: list[int] = []
        while not stop.wait(0.02):
            seen = server.connections_per_worker()
            if sum(seen) > sum(best):
                best = seen
            if sum(best) >= case.clients:
                break
        spread.append(best)

    midway = threading.Thread(target=look, daemon=True)
    writer_before = server.writer_counts()
    cpu_before, system_before = server.cpu_seconds(), system_cpu_seconds()
    midway.start()
    try:
        measured = _invoke(binary, server, case, settings.duration, work)
    finally:
        stop.set()
        midway.join()
    cpu_after, system_after = server.cpu_seconds(), system_cpu_seconds()
    report = measured.report
    measurement = Measurement(
        name=f"{case.label} (appendload{server.workers_suffix})",
        events=int(report["events"]),
        calls=int(report["appends"]),
        seconds=float(report["seconds"]) or settings.duration,
        client_cpu_seconds=measured.cpu_seconds,
        server_cpu_seconds=_delta(cpu_before, cpu_after),
        system_cpu_seconds=_delta(system_before, system_after),
        window_seconds=measured.wall_seconds,
        errors=int(report["errors"]),
        first_error=str(report["first_error"]),
        p50_ms=float(report["p50_ms"]),
        p99_ms=float(report["p99_ms"]),
    )
    writer = writer_figures(writer_before, server.writer_counts(), measurement.seconds)
    with grpc.insecure_channel(server.address) as channel:
        after = [next_seq(channel, session) for session in sessions]
    acked = [int(n) for n in report["acked_events_per_client"]]
    stored = [a - b for a, b in zip(after, before, strict=True)]
    for index, session in enumerate(sessions):
        if stored[index] != acked[index] or acked[index] == 0:
            measurement.errors += 1
            measurement.first_error = measurement.first_error or (
                f"session {session}: {acked[index]} events acknowledged, {stored[index]} stored"
            )
    measurement.details.update(
        load_client="appendload",
        mode=case.mode,
        clients=case.clients,
        window=case.window,
        events_per_call=case.events_per_append,
        max_ms=report["max_ms"],
        acked_events_per_client=acked,
        stored_events_per_client=stored,
        workers=server.workers,
        connections_per_worker=spread[0] if spread else [],
        writer=writer,
    )
    return measurement


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def main(argv: list[str] | None = None) -> int:
    """Build appendload for running it by hand; print the binary's path."""
    parser = argparse.ArgumentParser(prog="python -m bench.appendload", description=main.__doc__)
    parser.add_argument("directory", type=Path, nargs="?", default=DEFAULT_BUILD)
    args = parser.parse_args(argv)
    try:
        print(build(args.directory.resolve()))
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
