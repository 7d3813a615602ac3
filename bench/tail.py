"""Case 5, live tail: how long an appended event takes to reach followers.

One open-loop writer appends one event per call to one session at a steady rate (1,000 appends/s
by default), each call sent on schedule whether or not earlier ones have returned, and records
when it sent each call and when the acknowledgment came back, by seq. Followers hold
``Since(follow=True)`` streams on that session, opened and caught up before the writer starts,
and record when each event arrives. All processes read the same clock (CLOCK_MONOTONIC), so

- send→arrival is the time from sending an append to the event's arrival at a follower: the
  commit with its fsync, the wakeup and the send (the figure in the table);
- ack→arrival is how long after the writer's acknowledgment the follower had it (often
  negative: followers are woken at the same moment the append is acknowledged).

With a server of several workers, the writer's connection is held by worker 0 and each
follower process's by another worker (process i by worker i + 1, round the workers): each client
opens connections until one lands on its worker (the kernel picks the worker of a connection;
/proc says which one holds it). So with one follower every event crosses from the writer's
worker to the follower's, woken by the doorbell and read from the change feed; with 100 (two
processes on two workers) half the followers are on the writer's worker.

Followers count events without decoding them (seqs arrive dense and in order, so the n-th event
after the start has seq start + n), which keeps the client's share of the work small; the table
still shows the load generator's CPU, and 100 followers on 2 CPUs is more than Python clients
can drain at 1,000 events/s each.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from array import array
from dataclasses import dataclass
from typing import Any

import grpc

from bench.common import Measurement, Settings, append_request, count_events, percentile
from bench.load import START_TIMEOUT, Reports, report_failure, run_workers
from bench.procs import ServerProcess, tcp_connections
from sessionlog.v1 import session_log_service_pb2 as pb

SERVICE = "/sessionlog.v1.SessionLogService"
APPEND = f"{SERVICE}/Append"
SINCE = f"{SERVICE}/Since"
RATE = 1000.0
"""Appends per second the writer offers."""
DRAIN_SECONDS = 10.0
"""How long followers wait, after the writer's last append, for the events still on the way."""
MAX_FOLLOWERS_PER_PROCESS = 50


PIN_TRIES_PER_WORKER = 16
"""Connections a client may open, per worker, to land on the worker it is meant for (the
kernel picks a worker per connection; with 2 workers, 32 tries all miss once in 4 billion)."""
ACCEPT_SECONDS = 2.0
"""How long a new connection may take to show up in a worker's open files (its accept)."""


@dataclass(frozen=True)
class TailLoad:
    target: str
    session_id: str
    start_seq: int
    appends: int
    rate: float
    followers: int
    port: int = 0
    """The server's gRPC port (to find a connection's worker)."""
    worker_pids: tuple[int, ...] = ()
    """With several workers: their PIDs; the writer's connection is pinned to the first one,
    each follower process's to another (``_open``). Empty: wherever the kernel puts them."""


def run_tail(settings: Settings, server: ServerProcess, followers: int) -> Measurement:
    """Append ``RATE`` events/s for ``settings.duration`` s with ``followers`` live followers."""
    session_id = f"tail-{followers}"
    with grpc.insecure_channel(server.address) as channel:
        reply = channel.unary_unary(APPEND)(append_request(session_id, 1), timeout=30)
    start_seq = int(pb.AppendResponse.FromString(reply).next_seq)
    pids = tuple(server.worker_pids()) if server.workers > 1 else ()
    load = TailLoad(
        target=server.address,
        session_id=session_id,
        start_seq=start_seq,
        appends=max(1, round(RATE * settings.duration)),
        rate=RATE,
        followers=followers,
        port=server.port,
        worker_pids=pids,
    )
    processes = max(1, -(-followers // MAX_FOLLOWERS_PER_PROCESS))
    groups = [followers // processes + (i < followers % processes) for i in range(processes)]
    # With several workers the writer is on worker 0 and follower process i on worker i + 1
    # (round the workers): with one follower process every event crosses to another worker.
    targets: list[tuple[Any, tuple[Any, ...]]] = [(_writer, (load, 0 if pids else None))]
    targets += [
        (_followers, (load, count, (i + 1) % len(pids) if pids else None))
        for i, count in enumerate(groups)
    ]
    placed: list[list[list[int]]] = []
    reports = run_workers(
        targets,
        server.cpu_seconds,
        settings.duration + DRAIN_SECONDS,
        midway=(settings.duration / 2, lambda pids: placed.append(server.placement(pids))),
    )
    measurement = _merge(load, reports)
    measurement.name += server.workers_suffix
    # Which worker served the writer and which the followers, seen midway (each client process
    # holds one connection): a follower on another worker than the writer's is woken through
    # the doorbells and the change feed.
    placement = placed[0] if placed else []
    measurement.details.update(
        workers=server.workers,
        writer_workers=placement[0] if placement else [],
        follower_workers=sorted({w for found in placement[1:] for w in found}),
    )
    return measurement


def _merge(load: TailLoad, reports: Reports) -> Measurement:
    # Reports come back in the order the workers finished: the writer's is the one with "sent".
    writer = next(r for r in reports.workers if "sent" in r)
    followers = [r for r in reports.workers if "arrivals" in r]
    sent = array("q", writer["sent"])
    acked = array("q", writer["acked"])
    send_to_arrival: list[float] = []
    ack_to_arrival: list[float] = []
    missing = 0
    for report in followers:
        for arrivals in report["arrivals"]:
            for offset, arrived in enumerate(array("q", arrivals)):
                if not acked[offset]:
                    continue  # not acknowledged (failed, or never sent): nothing to wait for
                if not arrived:
                    missing += 1
                    continue
                send_to_arrival.append((arrived - sent[offset]) / 1e6)
                ack_to_arrival.append((arrived - acked[offset]) / 1e6)
    plural = "s" if load.followers > 1 else ""
    measurement = Measurement(
        name=f"5 live tail {load.rate:,.0f} ap/s, {load.followers} follower{plural}",
        events=writer["acknowledged"],
        calls=writer["acknowledged"],
        seconds=writer["wall"],
        client_cpu_seconds=sum(r["cpu"] for r in reports.workers),
        server_cpu_seconds=reports.server_cpu,
        system_cpu_seconds=reports.system_cpu,
        window_seconds=reports.window,
        client_processes=len(reports.workers),
        errors=writer["errors"] + missing,
        first_error=writer["first_error"]
        or (f"followers missed {missing} events within {DRAIN_SECONDS:g} s" if missing else ""),
    )
    measurement.set_latencies(send_to_arrival)
    ack_to_arrival.sort()
    measurement.details.update(
        followers=load.followers,
        offered_rate=load.rate,
        appends=load.appends,
        latency="send->arrival",
        ack_to_arrival_p50_ms=percentile(ack_to_arrival, 0.5),
        ack_to_arrival_p99_ms=percentile(ack_to_arrival, 0.99),
        append_p50_ms=writer["append_p50_ms"],
        append_p99_ms=writer["append_p99_ms"],
        samples=len(send_to_arrival),
    )
    return measurement


async def _open(load: TailLoad, worker: int | None) -> grpc.aio.Channel:
    """A channel to the server; given ``worker``, one whose connection that worker holds.

    The kernel picks the worker of each new connection, so this opens connections (each
    channel with a subchannel pool of its own, hence a connection of its own) until one lands
    there, and closes the others. Which worker holds it is read from /proc: the worker whose
    socket has this process's new local port as its remote port."""
    if worker is None:
        return grpc.aio.insecure_channel(load.target)
    options = [("grpc.use_local_subchannel_pool", 1)]
    for _ in range(PIN_TRIES_PER_WORKER * len(load.worker_pids)):
        before = _local_ports(load.port)
        channel = grpc.aio.insecure_channel(load.target, options=options)
        await asyncio.wait_for(channel.channel_ready(), START_TIMEOUT)
        new = _local_ports(load.port) - before
        if len(new) == 1 and await _holder(load, new.pop()) == worker:
            return channel
        await channel.close()
    raise RuntimeError(f"no connection landed on worker {worker} of {len(load.worker_pids)}")


def _local_ports(port: int) -> set[int]:
    """This process's local ports of its connections to the server's ``port``."""
    return {c.local_port for c in tcp_connections(os.getpid()) if c.remote_port == port}


async def _holder(load: TailLoad, local_port: int) -> int | None:
    """The index of the worker that holds the connection from ``local_port`` (polled: a
    connection shows in a worker's files once the worker accepted it)."""
    deadline = time.monotonic() + ACCEPT_SECONDS
    while time.monotonic() < deadline:
        for index, pid in enumerate(load.worker_pids):
            if any(
                c.local_port == load.port and c.remote_port == local_port
                for c in tcp_connections(pid)
            ):
                return index
        await asyncio.sleep(0.01)
    return None


def _writer(
    load: TailLoad,
    worker: int | None,
    barrier: Any,
    results: multiprocessing.Queue[dict[str, Any]],
) -> None:
    try:
        report = asyncio.run(_write(load, worker, barrier))
    except Exception as error:
        report_failure(barrier, results, error)
        return
    results.put(report)


async def _write(load: TailLoad, worker: int | None, barrier: Any) -> dict[str, Any]:
    sent = array("q", bytes(8 * load.appends))
    acked = array("q", bytes(8 * load.appends))
    latencies: list[float] = []
    errors: list[str] = []
    request = append_request(load.session_id, 1)
    async with await _open(load, worker) as channel:
        call = channel.unary_unary(APPEND)
        await call(pb.AppendRequest(session_id=load.session_id).SerializeToString(), timeout=30)
        barrier.wait(timeout=START_TIMEOUT)  # blocks the loop on purpose: nothing is in flight

        async def one() -> None:
            started = time.monotonic_ns()
            try:
                reply = await call(request, timeout=30)
            except grpc.RpcError as error:
                errors.append(f"{error.code()}: {error.details()}")
                return
            done = time.monotonic_ns()
            offset = int(pb.AppendResponse.FromString(reply).next_seq) - 1 - load.start_seq
            if 0 <= offset < load.appends:
                sent[offset], acked[offset] = started, done
            latencies.append((done - started) / 1e6)

        cpu, wall = time.process_time(), time.perf_counter()
        began = time.monotonic()
        tasks = []
        for i in range(load.appends):
            delay = began + i / load.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    latencies.sort()
    return {
        "sent": sent.tobytes(),
        "acked": acked.tobytes(),
        "acknowledged": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "append_p50_ms": percentile(latencies, 0.5),
        "append_p99_ms": percentile(latencies, 0.99),
        "cpu": cpu,
        "wall": wall,
    }


def _followers(
    load: TailLoad,
    count: int,
    worker: int | None,
    barrier: Any,
    results: multiprocessing.Queue[dict[str, Any]],
) -> None:
    try:
        report = asyncio.run(_follow(load, count, worker, barrier))
    except Exception as error:
        report_failure(barrier, results, error)
        return
    results.put(report)


async def _caught_up(stream: Any) -> None:
    """Read a follow stream up to its caught_up response (a new session sends nothing before)."""
    while True:
        response = await stream.read()
        if response is grpc.aio.EOF:
            raise RuntimeError("a follow stream ended before it was caught up")
        if pb.SinceResponse.FromString(response).caught_up:
            return


async def _follow(load: TailLoad, count: int, worker: int | None, barrier: Any) -> dict[str, Any]:
    request = pb.SinceRequest(
        session_id=load.session_id, seq=load.start_seq, follow=True
    ).SerializeToString()
    arrivals = [array("q", bytes(8 * load.appends)) for _ in range(count)]
    async with await _open(load, worker) as channel:
        since = channel.unary_stream(SINCE)
        streams = [since(request) for _ in range(count)]
        await asyncio.wait_for(
            asyncio.gather(*(_caught_up(stream) for stream in streams)), START_TIMEOUT
        )

        async def drain(stream: Any, into: array[int]) -> None:
            received = 0
            while received < load.appends:
                response = await stream.read()
                if response is grpc.aio.EOF:
                    return
                now = time.monotonic_ns()
                for _ in range(count_events(response)):
                    if received < load.appends:
                        into[received] = now
                    received += 1

        barrier.wait(timeout=START_TIMEOUT)
        cpu = time.process_time()
        deadline = load.appends / load.rate + DRAIN_SECONDS
        tasks = [asyncio.create_task(drain(s, a)) for s, a in zip(streams, arrivals, strict=True)]
        await asyncio.wait(tasks, timeout=deadline)
        for stream in streams:
            stream.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        cpu = time.process_time() - cpu
    return {"arrivals": [a.tobytes() for a in arrivals], "cpu": cpu}
