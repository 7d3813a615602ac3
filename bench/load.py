"""The load generator: client subprocesses that call a server and time every call.

Every load runs in fresh ``spawn``ed processes (grpc does not survive ``fork``), never in the
process that started the servers. The workers connect and warm up, meet the parent at a barrier,
run for a fixed time (and at most a fixed number of calls), then report counts, latencies and
their own CPU time (``time.process_time``: every thread of the process, grpc's included). The
parent reads the server's CPU from /proc over the same window.

Requests are pre-serialized bytes sent through the multicallable a generated stub would use, so
sessionlog and the echo ceiling pay exactly the same client cost per call.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

import grpc

from bench.common import Measurement, Settings, count_events, system_cpu_seconds

START_TIMEOUT = 60.0
"""Seconds for every worker to start, connect and warm up."""
RESULT_GRACE = 60.0
"""Seconds past the planned end a worker may take to report."""
CALL_TIMEOUT = 30.0
MAX_ERRORS = 100
"""A client stops after this many failed calls."""

ServerCpu = Callable[[], float | None]


@dataclass(frozen=True)
class UnaryLoad:
    """Clients each sending the same request over and over, one call in flight per client."""

    target: str
    method: str
    requests: tuple[bytes, ...]
    """One request per client; client i always sends requests[i]."""
    events_per_call: int
    duration: float
    warmup: float
    max_calls: int
    """Per client, warm-up included."""
    processes: int
    blocking: bool = False
    """One client on grpc's blocking API in one process (the sequential case)."""
    headers: tuple[str, ...] = ()
    """h2load only: one extra request header per client (``NAME: VALUE``; client i sends
    headers[i]), such as the ``x-session-id`` HAProxy routes by; empty: none."""
    in_flight: int = 1
    """h2load only: calls each client keeps in flight on its connection (``-m``)."""

    @classmethod
    def for_run(
        cls,
        settings: Settings,
        target: str,
        method: str,
        requests: tuple[bytes, ...],
        events_per_call: int,
        processes: int,
        blocking: bool = False,
    ) -> UnaryLoad:
        """A load of the run's duration, warm-up and call cap."""
        return cls(
            target=target,
            method=method,
            requests=requests,
            events_per_call=events_per_call,
            duration=settings.duration,
            warmup=settings.warmup,
            max_calls=settings.max_calls_per_client,
            processes=processes,
            blocking=blocking,
        )


@dataclass(frozen=True)
class StreamLoad:
    """One client reading a whole server stream, ``runs`` times after one untimed read."""

    target: str
    method: str
    request: bytes
    expected_events: int
    runs: int


@dataclass
class UnaryOutcome:
    measurement: Measurement
    acknowledged: dict[int, int]
    """Client index -> events the server acknowledged to it (warm-up included)."""


# -- parent side ------------------------------------------------------------------------------


def run_unary(load: UnaryLoad, name: str, server_cpu: ServerCpu) -> UnaryOutcome:
    """Run a unary load in worker processes and merge what they report."""
    count = 1 if load.blocking else max(1, min(load.processes, len(load.requests)))
    groups = [list(range(i, len(load.requests), count)) for i in range(count)]
    reports = run_workers(
        [(_unary_worker, (load, group)) for group in groups],
        server_cpu,
        load.warmup + load.duration,
    )
    latencies: list[float] = []
    acknowledged: dict[int, int] = {}
    measurement = Measurement(
        name=name,
        events=0,
        calls=0,
        seconds=max(r["wall"] for r in reports.workers),
        client_cpu_seconds=sum(r["cpu"] for r in reports.workers),
        server_cpu_seconds=reports.server_cpu,
        system_cpu_seconds=reports.system_cpu,
        window_seconds=reports.window,
        client_processes=count,
    )
    for report in reports.workers:
        latencies.extend(report["latencies_ms"])
        acknowledged.update(report["acknowledged"])
        measurement.calls += report["calls"]
        measurement.errors += report["errors"]
        measurement.first_error = measurement.first_error or report["first_error"]
    measurement.events = measurement.calls * load.events_per_call
    measurement.set_latencies(latencies)
    measurement.details.update(
        clients=len(load.requests),
        events_per_call=load.events_per_call,
        request_bytes=len(load.requests[0]),
    )
    return UnaryOutcome(measurement, acknowledged)


def run_stream(load: StreamLoad, name: str, server_cpu: ServerCpu) -> Measurement:
    """Read a server stream ``load.runs`` times from one worker process; totals over the runs."""
    measurement, runs = run_reads(_stream_worker, load, name, server_cpu, load.expected_events)
    measurement.details.update(
        events_per_run=load.expected_events,
        messages_per_run=runs[0]["messages"] if runs else 0,
        bytes_per_run=runs[0]["bytes"] if runs else 0,
    )
    return measurement


def run_reads(
    worker: Callable[..., None], load: Any, name: str, server_cpu: ServerCpu, expected: int
) -> tuple[Measurement, list[dict[str, Any]]]:
    """Run one ``worker`` process that reads a whole stream several times and reports each run
    (events, seconds); totals over the runs, the median run, and an error for every run that
    did not read ``expected`` events. Also returns the runs, for the caller's own details."""
    reports = run_workers([(worker, (load,))], server_cpu, 600.0)
    report = reports.workers[0]
    runs: list[dict[str, Any]] = report["runs"]
    measurement = Measurement(
        name=name,
        events=sum(r["events"] for r in runs),
        calls=len(runs),
        seconds=sum(r["seconds"] for r in runs),
        client_cpu_seconds=report["cpu"],
        server_cpu_seconds=reports.server_cpu,
        system_cpu_seconds=reports.system_cpu,
        window_seconds=reports.window,
        errors=report.get("errors", 0),
        first_error=report.get("first_error", ""),
    )
    seconds = sorted(r["seconds"] for r in runs)
    measurement.details.update(
        run_seconds=[r["seconds"] for r in runs],
        median_run_seconds=seconds[len(seconds) // 2] if seconds else None,
    )
    wrong = [r["events"] for r in runs if r["events"] != expected]
    if wrong:
        measurement.errors += len(wrong)
        measurement.first_error = measurement.first_error or (
            f"a run read {wrong[0]} events, expected {expected}"
        )
    return measurement, runs


@dataclass
class Reports:
    workers: list[dict[str, Any]]
    server_cpu: float | None
    system_cpu: float | None
    window: float


def run_workers(
    targets: list[tuple[Callable[..., None], tuple[Any, ...]]],
    server_cpu: ServerCpu,
    planned_seconds: float,
    midway: tuple[float, Callable[[list[int]], None]] | None = None,
) -> Reports:
    """Start one process per target, release them together, collect one report from each.

    ``midway``: ``(seconds, look)`` calls ``look`` with the PIDs of the processes (in the order
    of ``targets``) from a timer thread, that many seconds after their release: to look at the
    server and the clients under the load."""
    context: SpawnContext = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(targets) + 1)
    results: multiprocessing.Queue[dict[str, Any]] = context.Queue()
    processes: list[SpawnProcess] = [
        context.Process(target=target, args=(*args, barrier, results), daemon=True)
        for target, args in targets
    ]
    timer: threading.Timer | None = None
    try:
        for process in processes:
            process.start()
        try:
            barrier.wait(timeout=START_TIMEOUT + planned_seconds)
        except threading.BrokenBarrierError:
            raise RuntimeError(
                f"a load worker failed to start: {_first_failure(results)}"
            ) from None
        cpu_before, system_before = server_cpu(), system_cpu_seconds()
        started = time.perf_counter()
        if midway is not None:
            pids = [process.pid for process in processes if process.pid is not None]
            timer = threading.Timer(midway[0], midway[1], (pids,))
            timer.start()
        reports = [results.get(timeout=planned_seconds + RESULT_GRACE) for _ in processes]
        window = time.perf_counter() - started
        cpu_after, system_after = server_cpu(), system_cpu_seconds()
        for process in processes:
            process.join(10)
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()
        _stop_all(processes)
    failed = [r["failure"] for r in reports if r.get("failure")]
    if failed:
        raise RuntimeError(f"a load worker failed: {failed[0]}")
    return Reports(
        reports, _delta(cpu_before, cpu_after), _delta(system_before, system_after), window
    )


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def _first_failure(results: multiprocessing.Queue[dict[str, Any]]) -> str:
    try:
        return str(results.get(timeout=2.0).get("failure", "no report"))
    except queue.Empty:
        return "no report"


def _stop_all(processes: list[SpawnProcess]) -> None:
    """Terminate (then kill) any worker still running; each by its own PID."""
    for process in processes:
        if process.pid is not None and process.is_alive():
            process.terminate()
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)


# -- worker side ------------------------------------------------------------------------------


class _Tally:
    """What one client saw: successful calls, latencies of measured calls, failures."""

    def __init__(self) -> None:
        self.ok = 0
        self.errors = 0
        self.first_error = ""
        self.latencies_ms: list[float] = []

    def failed(self, error: grpc.RpcError) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = f"{error.code()}: {error.details()}"


def report_failure(
    barrier: Any, results: multiprocessing.Queue[dict[str, Any]], error: BaseException
) -> None:
    barrier.abort()
    results.put({"failure": f"{type(error).__name__}: {error}"})


def _unary_worker(
    load: UnaryLoad,
    clients: list[int],
    barrier: Any,
    results: multiprocessing.Queue[dict[str, Any]],
) -> None:
    try:
        if load.blocking:
            report = _blocking_clients(load, clients, barrier)
        else:
            report = asyncio.run(_async_clients(load, clients, barrier))
    except Exception as error:
        report_failure(barrier, results, error)
        return
    results.put(report)


def _blocking_clients(load: UnaryLoad, clients: list[int], barrier: Any) -> dict[str, Any]:
    (index,) = clients
    request = load.requests[index]
    with grpc.insecure_channel(load.target) as channel:
        call = channel.unary_unary(load.method)
        warm, measured = _Tally(), _Tally()

        def drive(tally: _Tally, seconds: float, limit: int, timed: bool) -> None:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end and tally.ok + tally.errors < limit:
                if tally.errors >= MAX_ERRORS:
                    return
                started = time.perf_counter_ns()
                try:
                    call(request, timeout=CALL_TIMEOUT)
                except grpc.RpcError as error:
                    tally.failed(error)
                    continue
                tally.ok += 1
                if timed:
                    tally.latencies_ms.append((time.perf_counter_ns() - started) / 1e6)

        drive(warm, load.warmup, load.max_calls, timed=False)
        barrier.wait(timeout=START_TIMEOUT)
        cpu, wall = time.process_time(), time.perf_counter()
        drive(measured, load.duration, max(0, load.max_calls - warm.ok), timed=True)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return _unary_report(load, {index: (warm, measured)}, cpu, wall)


async def _async_clients(load: UnaryLoad, clients: list[int], barrier: Any) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(load.target) as channel:
        call = channel.unary_unary(load.method)
        tallies = {index: (_Tally(), _Tally()) for index in clients}

        async def drive(index: int, tally: _Tally, seconds: float, limit: int, timed: bool) -> None:
            request = load.requests[index]
            end = time.perf_counter() + seconds
            while time.perf_counter() < end and tally.ok + tally.errors < limit:
                if tally.errors >= MAX_ERRORS:
                    return
                started = time.perf_counter_ns()
                try:
                    await call(request, timeout=CALL_TIMEOUT)
                except grpc.RpcError as error:
                    tally.failed(error)
                    continue
                tally.ok += 1
                if timed:
                    tally.latencies_ms.append((time.perf_counter_ns() - started) / 1e6)

        await asyncio.gather(
            *(
                drive(i, warm, load.warmup, load.max_calls, False)
                for i, (warm, _) in tallies.items()
            )
        )
        barrier.wait(timeout=START_TIMEOUT)  # blocks the loop on purpose: nothing is in flight
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(
            *(
                drive(i, measured, load.duration, max(0, load.max_calls - warm.ok), True)
                for i, (warm, measured) in tallies.items()
            )
        )
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return _unary_report(load, tallies, cpu, wall)


def _unary_report(
    load: UnaryLoad, tallies: dict[int, tuple[_Tally, _Tally]], cpu: float, wall: float
) -> dict[str, Any]:
    measured = [m for _, m in tallies.values()]
    return {
        "calls": sum(m.ok for m in measured),
        "errors": sum(w.errors + m.errors for w, m in tallies.values()),
        "first_error": next(
            (t.first_error for pair in tallies.values() for t in pair if t.errors), ""
        ),
        "latencies_ms": [ms for m in measured for ms in m.latencies_ms],
        "acknowledged": {
            index: (warm.ok + m.ok) * load.events_per_call for index, (warm, m) in tallies.items()
        },
        "cpu": cpu,
        "wall": wall,
    }


def _stream_worker(
    load: StreamLoad, barrier: Any, results: multiprocessing.Queue[dict[str, Any]]
) -> None:
    try:
        with grpc.insecure_channel(load.target) as channel:
            call = channel.unary_stream(load.method)
            _read_stream(call, load.request)  # untimed: connection up, caches warm
            barrier.wait(timeout=START_TIMEOUT)
            cpu = time.process_time()
            runs = [_read_stream(call, load.request) for _ in range(load.runs)]
            cpu = time.process_time() - cpu
    except grpc.RpcError as error:
        report_failure(barrier, results, RuntimeError(f"{error.code()}: {error.details()}"))
        return
    except Exception as error:
        report_failure(barrier, results, error)
        return
    results.put({"runs": runs, "cpu": cpu, "errors": 0, "first_error": ""})


def _read_stream(call: Any, request: bytes) -> dict[str, Any]:
    """Read one whole stream, counting events; the time is from the call to the stream's end."""
    events = messages = size = 0
    started = time.perf_counter()
    for response in call(request, timeout=CALL_TIMEOUT):
        events += count_events(response)
        messages += 1
        size += len(response)
    seconds = time.perf_counter() - started
    return {"events": events, "messages": messages, "bytes": size, "seconds": seconds}
