"""The peer: Redis Streams, started by the bench on loopback, durable like sessionlog.

``redis-server`` (Debian's package) runs with ``appendonly yes`` and ``appendfsync always`` (every
write is in the append-only file and fsynced before the reply, as sessionlog acknowledges only
synced commits), no RDB snapshots, in the run's temp dir. The clients are redis-py with its
hiredis parser (the fast path a Python user would pick), in spawned processes like every load:

- XADD one entry per call, one client, one call at a time (next to case 1);
- XADD pipelined by 100, 4 concurrent clients, one stream each (next to case 3);
- XRANGE catch-up: a stream of ``redis_events`` entries read whole in pages of the size of a
  Since batch (``COUNT``, exclusive start ids), ``since_runs`` times after one untimed read (next
  to case 4); the client keeps hiredis's reply as it is, as the Since client counts events
  without decoding them.

Each entry holds one field whose value is the stored benchmark event (the bytes Since sends).
When ``redis-server`` or redis-py is missing, these rows are skipped with a note.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import SINCE_BATCH_BYTES, Measurement, Settings, stored_event
from bench.load import (
    CALL_TIMEOUT,
    MAX_ERRORS,
    START_TIMEOUT,
    report_failure,
    run_reads,
    run_workers,
)
from bench.procs import ChildProcess, free_port

START_SECONDS = 30.0
FIELD = b"e"
FILL_PIPELINE = 1000


def unavailable() -> str:
    """Why the Redis rows cannot run here, or "" when they can."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (apt-get install redis-server)"
    if importlib.util.find_spec("redis") is None:
        return "redis-py is not installed (pip install -e '.[dev]')"
    return ""


class RedisProcess(ChildProcess):
    """One redis-server subprocess on 127.0.0.1, stopped by its PID."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.log_path = directory / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisProcess:
        import redis

        self.directory.mkdir(parents=True, exist_ok=True)
        argv = [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.log_path),
        ]  # fmt: skip
        self.process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + START_SECONDS
        client = redis.Redis(port=self.port, socket_timeout=1.0)
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}")
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError:
                    time.sleep(0.05)
            raise RuntimeError(f"redis-server not answering PING within {START_SECONDS:.0f} s")
        except BaseException:
            self.stop()
            raise
        finally:
            client.close()


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(directory).start()
    try:
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class XaddLoad:
    port: int
    clients: int
    entries_per_call: int
    duration: float
    warmup: float
    max_calls: int
    processes: int


def xadd(settings: Settings, server: RedisProcess, clients: int, per_call: int) -> Measurement:
    """``clients`` clients (one stream each) adding ``per_call`` entries per round trip."""
    load = XaddLoad(
        port=server.port,
        clients=clients,
        entries_per_call=per_call,
        duration=settings.duration,
        warmup=settings.warmup,
        max_calls=settings.max_calls_per_client,
        processes=1 if clients == 1 else min(settings.client_processes, clients),
    )
    groups = [list(range(i, clients, load.processes)) for i in range(load.processes)]
    reports = run_workers(
        [(_xadd_worker, (load, group)) for group in groups],
        server.cpu_seconds,
        load.warmup + load.duration,
    )
    mode = "one per call" if per_call == 1 else f"pipelined by {per_call}"
    plural = "s" if clients > 1 else ""
    measurement = Measurement(
        name=f"Redis XADD {mode}, {clients} client{plural}",
        events=0,
        calls=sum(r["calls"] for r in reports.workers),
        seconds=max(r["wall"] for r in reports.workers),
        client_cpu_seconds=sum(r["cpu"] for r in reports.workers),
        server_cpu_seconds=reports.server_cpu,
        system_cpu_seconds=reports.system_cpu,
        window_seconds=reports.window,
        client_processes=load.processes,
        errors=sum(r["errors"] for r in reports.workers),
        first_error=next((r["first_error"] for r in reports.workers if r["first_error"]), ""),
    )
    measurement.events = measurement.calls * per_call
    measurement.set_latencies([ms for r in reports.workers for ms in r["latencies_ms"]])
    measurement.details.update(appendfsync="always", entries_per_call=per_call, clients=clients)
    stored = _stream_lengths(load)
    acknowledged = sum(r["acknowledged"] for r in reports.workers)
    if stored != acknowledged:
        measurement.errors += 1
        measurement.first_error = measurement.first_error or (
            f"{acknowledged} entries acknowledged, {stored} stored"
        )
    return measurement


def _stream_lengths(load: XaddLoad) -> int:
    import redis

    client = redis.Redis(port=load.port)
    try:
        return sum(int(client.xlen(_stream(load, i))) for i in range(load.clients))
    finally:
        client.close()


def _stream(load: XaddLoad, index: int) -> str:
    """Client ``index``'s stream; each load has streams of its own."""
    return f"xadd-{load.entries_per_call}x{load.clients}-{index}"


def _xadd_worker(
    load: XaddLoad,
    clients: list[int],
    barrier: Any,
    results: multiprocessing.Queue[dict[str, Any]],
) -> None:
    import threading

    import redis

    try:
        value = stored_event(1000)
        tallies: dict[int, dict[str, Any]] = {}

        def drive(index: int, seconds: float, limit: int, timed: bool) -> dict[str, Any]:
            client = redis.Redis(port=load.port, socket_timeout=CALL_TIMEOUT)
            tally: dict[str, Any] = {"ok": 0, "errors": 0, "first_error": "", "latencies": []}
            end = time.perf_counter() + seconds
            try:
                while time.perf_counter() < end and tally["ok"] + tally["errors"] < limit:
                    if tally["errors"] >= MAX_ERRORS:
                        break
                    started = time.perf_counter_ns()
                    try:
                        if load.entries_per_call == 1:
                            client.xadd(_stream(load, index), {FIELD: value})
                        else:
                            pipe = client.pipeline(transaction=False)
                            for _ in range(load.entries_per_call):
                                pipe.xadd(_stream(load, index), {FIELD: value})
                            pipe.execute()
                    except redis.RedisError as error:
                        tally["errors"] += 1
                        tally["first_error"] = tally["first_error"] or str(error)
                        continue
                    tally["ok"] += 1
                    if timed:
                        tally["latencies"].append((time.perf_counter_ns() - started) / 1e6)
            finally:
                client.close()
            return tally

        def run(timed: bool, seconds: float) -> None:
            threads = []
            for index in clients:

                def target(index: int = index) -> None:
                    done = tallies.get(index, {}).get("ok", 0)
                    tally = drive(index, seconds, max(0, load.max_calls - done), timed)
                    if timed:
                        tallies[index] = {**tally, "warm": done}
                    else:
                        tallies[index] = tally

                threads.append(threading.Thread(target=target))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

        run(False, load.warmup)
        barrier.wait(timeout=START_TIMEOUT)
        cpu, wall = time.process_time(), time.perf_counter()
        run(True, load.duration)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    except Exception as error:
        report_failure(barrier, results, error)
        return
    results.put(
        {
            "calls": sum(t["ok"] for t in tallies.values()),
            "errors": sum(t["errors"] for t in tallies.values()),
            "first_error": next((t["first_error"] for t in tallies.values() if t["errors"]), ""),
            "latencies_ms": [ms for t in tallies.values() for ms in t["latencies"]],
            "acknowledged": sum(
                (t["ok"] + t["warm"]) * load.entries_per_call for t in tallies.values()
            ),
            "cpu": cpu,
            "wall": wall,
        }
    )


# -- XRANGE catch-up ---------------------------------------------------------------------------


@dataclass(frozen=True)
class XrangeLoad:
    port: int
    stream: str
    expected: int
    page: int
    runs: int


def xrange_catch_up(settings: Settings, server: RedisProcess) -> Measurement:
    """Fill one stream, then read it whole in Since-sized pages, ``since_runs`` times."""
    import redis

    stream = "catch-up"
    value = stored_event(1000)
    client = redis.Redis(port=server.port)
    try:
        written = 0
        while written < settings.redis_events:
            pipe = client.pipeline(transaction=False)
            for _ in range(min(FILL_PIPELINE, settings.redis_events - written)):
                pipe.xadd(stream, {FIELD: value})
            written += len(pipe.execute())
    finally:
        client.close()
    entry_bytes = len(value) + 30  # the value, the field name, the id and the reply's framing
    load = XrangeLoad(
        port=server.port,
        stream=stream,
        expected=settings.redis_events,
        page=max(1, SINCE_BATCH_BYTES // entry_bytes),
        runs=settings.since_runs,
    )
    measurement, _ = run_reads(
        _xrange_worker,
        load,
        f"Redis XRANGE {settings.redis_events:,} entries",
        server.cpu_seconds,
        load.expected,
    )
    measurement.details.update(page_entries=load.page)
    return measurement


def _xrange_worker(
    load: XrangeLoad, barrier: Any, results: multiprocessing.Queue[dict[str, Any]]
) -> None:
    import redis

    try:
        client = redis.Redis(port=load.port, socket_timeout=CALL_TIMEOUT)
        # hiredis's reply as it is (lists of ids and field/value pairs), without redis-py's
        # per-entry dicts: like the Since client, which counts events without decoding them.
        client.set_response_callback("XRANGE", lambda response, **options: response)
        try:
            _read_stream(client, load)  # untimed: connection up, caches warm
            barrier.wait(timeout=START_TIMEOUT)
            cpu = time.process_time()
            runs = [_read_stream(client, load) for _ in range(load.runs)]
            cpu = time.process_time() - cpu
        finally:
            client.close()
    except Exception as error:
        report_failure(barrier, results, error)
        return
    results.put({"runs": runs, "cpu": cpu})


def _read_stream(client: Any, load: XrangeLoad) -> dict[str, Any]:
    events = pages = 0
    start = "-"
    started = time.perf_counter()
    while events < load.expected + 1:
        page = client.xrange(load.stream, min=start, max="+", count=load.page)
        if not page:
            break
        events += len(page)
        pages += 1
        start = b"(" + page[-1][0]
    return {"events": events, "pages": pages, "seconds": time.perf_counter() - started}
