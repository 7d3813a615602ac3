"""Case 7, many sessions: the server's memory with 10,000 sessions of 100 events, and how fast
ListSessions pages through them.

Setup (untimed): ``sessions_count`` sessions ``c7-00000``, ``c7-00001``, ... are written into the
running server, one Append of ``sessions_events`` events each, ``sessions_fill_clients`` Appends
in flight at a time (grpc.aio in this process; the fill's rate is reported, not judged). The
server's resident memory is read from /proc/PID/status before filling, after filling and after
paging: VmRSS (everything resident), RssAnon (private memory: the Python heap, caches) and
RssFile (mapped files, mostly LMDB's map, which the kernel may drop and read again). The server
has run the earlier cases of the run by then, so "before filling" is its memory at that point,
and the growth is what these sessions cost.

Timed: one client (this process, one call at a time) pages through them with ``prefix="c7-"``, so
that sessions of other cases do not count, with page_size 100 and then 1000, each
``sessions_list_passes`` times after one untimed pass. sessions/s is the sessions listed over the
wall time of the timed passes (the client decodes each reply for its next_page_token, as any
client must); p50/p99 are per page, from the call to its reply. Every pass must list exactly the
sessions written, in id order, each with ``sessions_events`` events (checked after the timed
passes); anything else is an error of the case, as a failed Append of the fill is.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import grpc

from bench.common import (
    Measurement,
    Settings,
    append_request,
    process_memory_kib,
    system_cpu_seconds,
)
from bench.procs import ServerProcess
from sessionlog.v1 import session_log_service_pb2 as pb

SERVICE = "/sessionlog.v1.SessionLogService"
APPEND = f"{SERVICE}/Append"
LIST = f"{SERVICE}/ListSessions"
PREFIX = "c7-"
PAGE_SIZES = (100, 1000)
CALL_TIMEOUT = 60.0
MAX_ERRORS = 100
"""The fill stops after this many failed Appends."""


@dataclass
class MemorySample:
    """The server's resident memory at one point of the case, in KiB."""

    when: str
    kib: dict[str, int]


@dataclass
class SessionsResult:
    """What case 7 measured: the fill, one listing per page size, and the server's memory."""

    sessions: int
    events_per_session: int
    fill: Measurement
    listings: list[Measurement]
    memory: list[MemorySample]

    def measurements(self) -> list[Measurement]:
        return [self.fill, *self.listings]

    def to_json(self) -> dict[str, Any]:
        return {
            "sessions": self.sessions,
            "events_per_session": self.events_per_session,
            "prefix": PREFIX,
            "fill": self.fill.to_json(),
            "listings": [m.to_json() for m in self.listings],
            "server_memory_kib": [{"when": s.when, **s.kib} for s in self.memory],
        }


def session_ids(count: int) -> list[str]:
    """The case's session ids, zero-padded so that id order is creation order."""
    width = max(5, len(str(count - 1)))
    return [f"{PREFIX}{i:0{width}d}" for i in range(count)]


def label(count: int, events: int) -> str:
    return f"{count:,} sessions x {events} ev"


def run_sessions(
    settings: Settings, server: ServerProcess, count: int | None = None
) -> SessionsResult:
    """Fill ``count`` sessions (default ``settings.sessions_count``), then page through them."""
    count = settings.sessions_count if count is None else count
    events = settings.sessions_events
    memory = [MemorySample("before filling", process_memory_kib(server.pid))]
    fill = fill_sessions(settings, server, count)
    memory.append(
        MemorySample(f"after filling {label(count, events)}", process_memory_kib(server.pid))
    )
    listings = [list_sessions(settings, server, count, size) for size in PAGE_SIZES]
    memory.append(MemorySample("after paging", process_memory_kib(server.pid)))
    missing = [s.when for s in memory if not s.kib]
    if missing:
        fill.errors += 1
        fill.first_error = fill.first_error or f"no /proc/{server.pid}/status {missing[0]}"
    return SessionsResult(count, events, fill, listings, memory)


def fill_sessions(settings: Settings, server: ServerProcess, count: int) -> Measurement:
    """Write the sessions, ``sessions_fill_clients`` Appends in flight (untimed setup)."""
    events = settings.sessions_events
    # Serialized messages concatenate into their merge: the session id, then the same events.
    body = append_request("", events)
    requests = [
        pb.AppendRequest(session_id=s).SerializeToString() + body for s in session_ids(count)
    ]
    server_cpu, system = server.cpu_seconds(), system_cpu_seconds()
    cpu, started = time.process_time(), time.perf_counter()
    latencies, errors, first_error = asyncio.run(
        _fill(server.address, requests, settings.sessions_fill_clients)
    )
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    server_after, system_after = server.cpu_seconds(), system_cpu_seconds()
    measurement = Measurement(
        name=f"7 fill {label(count, events)}, {settings.sessions_fill_clients} in flight",
        events=len(latencies) * events,
        calls=len(latencies),
        seconds=seconds,
        client_cpu_seconds=cpu,
        server_cpu_seconds=_delta(server_cpu, server_after),
        system_cpu_seconds=_delta(system, system_after),
        errors=errors,
        first_error=first_error,
    )
    measurement.set_latencies(latencies)
    measurement.details.update(
        sessions=count,
        events_per_call=events,
        in_flight=settings.sessions_fill_clients,
        request_bytes=len(requests[0]) if requests else 0,
    )
    return measurement


async def _fill(target: str, requests: list[bytes], clients: int) -> tuple[list[float], int, str]:
    """Send every request once, ``clients`` at a time; latencies of the successful ones (ms)."""
    latencies: list[float] = []
    errors = 0
    first_error = ""
    pending = iter(requests)
    async with grpc.aio.insecure_channel(target) as channel:
        append = channel.unary_unary(APPEND)

        async def client() -> None:
            nonlocal errors, first_error
            for request in pending:  # shared: each request is taken by one client
                if errors >= MAX_ERRORS:
                    return
                started = time.perf_counter_ns()
                try:
                    await append(request, timeout=CALL_TIMEOUT)
                except grpc.RpcError as error:
                    errors += 1
                    first_error = first_error or f"Append: {error.code()}: {error.details()}"
                    continue
                latencies.append((time.perf_counter_ns() - started) / 1e6)

        await asyncio.gather(*(client() for _ in range(max(1, clients))))
    if errors >= MAX_ERRORS:
        first_error += f" (stopped after {errors} failed Appends)"
    return latencies, errors, first_error


def list_sessions(
    settings: Settings, server: ServerProcess, count: int, page_size: int
) -> Measurement:
    """Page through the case's sessions: one untimed pass, then ``sessions_list_passes`` timed."""
    expected = session_ids(count)
    max_pages = count // page_size + 2
    passes = max(1, settings.sessions_list_passes)
    measurement = Measurement(
        name=f"7 list {label(count, settings.sessions_events)}, page {page_size}",
        events=0,
        calls=0,
        seconds=0.0,
        client_cpu_seconds=0.0,
    )
    measurement.details.update(page_size=page_size, passes=passes, sessions_expected=count)
    try:
        with grpc.insecure_channel(server.address) as channel:
            call = channel.unary_unary(LIST)
            untimed = _list_pass(call, page_size, max_pages)
            server_cpu, system = server.cpu_seconds(), system_cpu_seconds()
            cpu, started = time.process_time(), time.perf_counter()
            timed = [_list_pass(call, page_size, max_pages) for _ in range(passes)]
            window, cpu = time.perf_counter() - started, time.process_time() - cpu
            server_after, system_after = server.cpu_seconds(), system_cpu_seconds()
    except grpc.RpcError as error:
        measurement.errors = 1
        measurement.first_error = f"ListSessions: {error.code()}: {error.details()}"
        return measurement
    latencies = [ms for pages in timed for ms, _ in pages]
    listed = [_parse(pages) for pages in timed]
    measurement.events = sum(len(ids) for ids, _ in listed)
    measurement.calls = len(latencies)
    measurement.seconds = window
    measurement.client_cpu_seconds = cpu
    measurement.server_cpu_seconds = _delta(server_cpu, server_after)
    measurement.system_cpu_seconds = _delta(system, system_after)
    measurement.set_latencies(latencies)
    for pages in (untimed, *timed):
        problem = _check(pages, expected, settings.sessions_events)
        if problem:
            measurement.errors += 1
            measurement.first_error = measurement.first_error or problem
    measurement.details.update(
        sessions_listed_per_pass=[len(ids) for ids, _ in listed],
        pages_per_pass=[len(pages) for pages in timed],
    )
    return measurement


def _list_pass(
    call: grpc.UnaryUnaryMultiCallable, page_size: int, max_pages: int
) -> list[tuple[float, bytes]]:
    """Every page of one pass, each with its call time in ms; stops at ``max_pages``."""
    pages: list[tuple[float, bytes]] = []
    token = ""
    while len(pages) < max_pages:
        request = pb.ListSessionsRequest(page_size=page_size, page_token=token, prefix=PREFIX)
        raw = request.SerializeToString()
        started = time.perf_counter_ns()
        reply: bytes = call(raw, timeout=CALL_TIMEOUT)
        pages.append(((time.perf_counter_ns() - started) / 1e6, reply))
        token = pb.ListSessionsResponse.FromString(reply).next_page_token
        if not token:
            break
    return pages


def _parse(pages: list[tuple[float, bytes]]) -> tuple[list[str], list[int]]:
    """The session ids and event counts one pass listed, in order."""
    ids: list[str] = []
    counts: list[int] = []
    for _, reply in pages:
        for session in pb.ListSessionsResponse.FromString(reply).sessions:
            ids.append(session.session_id)
            counts.append(session.event_count)
    return ids, counts


def _check(pages: list[tuple[float, bytes]], expected: list[str], events: int) -> str:
    """Why one pass did not list exactly the sessions written, or ""."""
    ids, counts = _parse(pages)
    if pb.ListSessionsResponse.FromString(pages[-1][1]).next_page_token:
        return f"still a next_page_token after {len(pages)} pages"
    if ids != expected:
        return f"listed {len(ids):,} sessions, expected {len(expected):,} ({PREFIX}...)"
    wrong = [(i, c) for i, c in zip(ids, counts, strict=True) if c != events]
    if wrong:
        return f"session {wrong[0][0]} lists {wrong[0][1]} events, expected {events}"
    return ""


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before
