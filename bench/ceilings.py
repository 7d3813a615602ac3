"""Ceilings measured in the same run: what the stack under sessionlog can do with no sessionlog.

- Echo unary: the same request bytes, the same clients and processes, to a grpc.aio server that
  returns the request. What gRPC in Python costs per call, on this machine, now.
- Echo streaming: the same number of events in the same ~256 KiB batches as Since, sent from
  memory. What the stream transport costs.
- Bare LMDB: synced commits (py-lmdb, sync=True, like the store) of 1 and of 100 event-sized
  values per transaction, with the store's key layout. What the disk's fsync allows.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import lmdb

from bench import echo, h2load
from bench.common import Measurement, Settings, stored_event, system_cpu_seconds
from bench.load import StreamLoad, UnaryLoad, run_stream, run_unary
from bench.procs import ServerProcess
from sessionlog.storage.schema import event_key

LMDB_MAP_SIZE = 4 << 30
MAX_TRANSACTIONS = 1_000_000


def echo_unary(load: UnaryLoad, server: ServerProcess) -> Measurement:
    """The given append load, byte for byte, against the echo server."""
    echo_load = replace(load, target=server.address, method=echo.UNARY)
    clients = len(load.requests)
    request_bytes = len(load.requests[0])
    name = f"echo unary {request_bytes} B, {clients} client{'s' if clients > 1 else ''}"
    return run_unary(echo_load, name, server.cpu_seconds).measurement


def echo_unary_h2load(
    load: UnaryLoad, server: ServerProcess, work: Path, *, via_thread: bool = False
) -> Measurement:
    """The given h2load append load, byte for byte, against the echo server; ``via_thread``:
    each call handed to a worker thread and back (``echo.UNARY_VIA_THREAD``)."""
    method = echo.UNARY_VIA_THREAD if via_thread else echo.UNARY
    echo_load = replace(load, target=server.address, method=method)
    clients = len(load.requests)
    request_bytes = len(load.requests[0])
    how = " via a thread" if via_thread else ""
    name = (
        f"echo unary {request_bytes} B{how}, {clients} client{'s' if clients > 1 else ''} (h2load)"
    )
    h2load.warm_up(echo_load, work)
    return h2load.measure(echo_load, name, server.cpu_seconds, work).measurement


def echo_stream(settings: Settings, server: ServerProcess) -> Measurement:
    """``since_events`` stored-size events streamed in Since-sized batches from memory."""
    load = StreamLoad(
        target=server.address,
        method=echo.STREAM,
        request=str(settings.since_events).encode(),
        expected_events=settings.since_events,
        runs=settings.since_runs,
    )
    return run_stream(load, f"echo stream {settings.since_events:,} ev", server.cpu_seconds)


def lmdb_commits(settings: Settings, parent: Path, events_per_txn: int) -> Measurement:
    """Synced LMDB write transactions of ``events_per_txn`` puts each, for ``duration`` seconds.

    Runs in this process (there is no server); its CPU is the "client" CPU.
    """
    directory = Path(tempfile.mkdtemp(prefix="lmdb-ceiling-", dir=parent))
    env = lmdb.open(
        str(directory), map_size=LMDB_MAP_SIZE, sync=True, metasync=True, readahead=False
    )
    try:
        value = stored_event(1000)
        seq = 0

        def commit() -> None:
            nonlocal seq
            with env.begin(write=True) as txn:
                for _ in range(events_per_txn):
                    txn.put(event_key(0, seq), value, overwrite=False)
                    seq += 1

        warm_end = time.perf_counter() + settings.warmup
        while time.perf_counter() < warm_end:
            commit()
        latencies: list[float] = []
        system = system_cpu_seconds()
        cpu, started = time.process_time(), time.perf_counter()
        end = started + settings.duration
        while time.perf_counter() < end and len(latencies) < MAX_TRANSACTIONS:
            before = time.perf_counter_ns()
            commit()
            latencies.append((time.perf_counter_ns() - before) / 1e6)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        system_after = system_cpu_seconds()
    finally:
        env.close()
        shutil.rmtree(directory, ignore_errors=True)
    measurement = Measurement(
        name=f"LMDB synced, {events_per_txn} ev/txn",
        events=len(latencies) * events_per_txn,
        calls=len(latencies),
        seconds=seconds,
        client_cpu_seconds=cpu,
        system_cpu_seconds=None
        if system is None or system_after is None
        else system_after - system,
    )
    measurement.set_latencies(latencies)
    measurement.details.update(events_per_txn=events_per_txn, value_bytes=len(value))
    return measurement


def in_series(first: Measurement, second: Measurement) -> Measurement:
    """A derived ceiling: every event pays ``first``'s time per event, then ``second``'s.

    A sequential client waits for the network round trip and for the fsync one after the other,
    so its ceiling is 1 / (1/a + 1/b), lower than either alone. Nothing is measured here.
    """
    seconds = first.seconds + second.seconds
    a, b = first.events_per_second, second.events_per_second
    rate = 1.0 / (1.0 / a + 1.0 / b) if a and b else 0.0
    client = first.details.get("load_client")
    measurement = Measurement(
        name=f"{first.name.split(',')[0]} + LMDB 1/txn (derived{', ' + client if client else ''})",
        events=round(rate * seconds),
        calls=0,
        seconds=seconds,
        client_cpu_seconds=first.client_cpu_seconds + second.client_cpu_seconds,
    )
    if first.p50_ms is not None and second.p50_ms is not None:
        measurement.p50_ms = first.p50_ms + second.p50_ms
    measurement.details["derived_from"] = [first.name, second.name]
    return measurement
