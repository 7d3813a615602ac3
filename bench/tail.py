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

Followers count events without decoding them (seqs arrive dense and in order, so the n-th event
after the start has seq start + n), which keeps the client's share of the work small; the table
still shows the load generator's CPU, and 100 followers on 2 CPUs is more than Python clients
can drain at 1,000 events/s each.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from array import array
from dataclasses import dataclass
from typing import Any

import grpc

from bench.common import Measurement, Settings, append_request, count_events, percentile
from bench.load import START_TIMEOUT, Reports, report_failure, run_workers
from bench.procs import ServerProcess
from sessionlog.v1 import session_log_service_pb2 as pb

SERVICE = "/sessionlog.v1.SessionLogService"
APPEND = f"{SERVICE}/Append"
SINCE = f"{SERVICE}/Since"
RATE = 1000.0
"""Appends per second the writer offers."""
DRAIN_SECONDS = 10.0
"""How long followers wait, after the writer's last append, for the events still on the way."""
MAX_FOLLOWERS_PER_PROCESS = 50


@dataclass(frozen=True)
class TailLoad:
    target: str
    session_id: str
    start_seq: int
    appends: int
    rate: float
    followers: int


def run_tail(settings: Settings, server: ServerProcess, followers: int) -> Measurement:
    """Append ``RATE`` events/s for ``settings.duration`` s with ``followers`` live followers."""
    session_id = f"tail-{followers}"
    with grpc.insecure_channel(server.address) as channel:
        reply = channel.unary_unary(APPEND)(append_request(session_id, 1), timeout=30)
    start_seq = int(pb.AppendResponse.FromString(reply).next_seq)
    load = TailLoad(
        target=server.address,
        session_id=session_id,
        start_seq=start_seq,
        appends=max(1, round(RATE * settings.duration)),
        rate=RATE,
        followers=followers,
    )
    processes = max(1, -(-followers // MAX_FOLLOWERS_PER_PROCESS))
    groups = [followers // processes + (i < followers % processes) for i in range(processes)]
    targets: list[tuple[Any, tuple[Any, ...]]] = [(_writer, (load,))]
    targets += [(_followers, (load, count)) for count in groups]
    reports = run_workers(targets, server.cpu_seconds, settings.duration + DRAIN_SECONDS)
    return _merge(load, reports)


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


def _writer(load: TailLoad, barrier: Any, results: multiprocessing.Queue[dict[str, Any]]) -> None:
    try:
        report = asyncio.run(_write(load, barrier))
    except Exception as error:
        report_failure(barrier, results, error)
        return
    results.put(report)


async def _write(load: TailLoad, barrier: Any) -> dict[str, Any]:
    sent = array("q", bytes(8 * load.appends))
    acked = array("q", bytes(8 * load.appends))
    latencies: list[float] = []
    errors: list[str] = []
    request = append_request(load.session_id, 1)
    async with grpc.aio.insecure_channel(load.target) as channel:
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
    load: TailLoad, count: int, barrier: Any, results: multiprocessing.Queue[dict[str, Any]]
) -> None:
    try:
        report = asyncio.run(_follow(load, count, barrier))
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


async def _follow(load: TailLoad, count: int, barrier: Any) -> dict[str, Any]:
    request = pb.SinceRequest(
        session_id=load.session_id, seq=load.start_seq, follow=True
    ).SerializeToString()
    arrivals = [array("q", bytes(8 * load.appends)) for _ in range(count)]
    async with grpc.aio.insecure_channel(load.target) as channel:
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
