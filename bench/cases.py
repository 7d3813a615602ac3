"""The sessionlog cases: appends one at a time, concurrent, batched; and a Since catch-up.

Each client appends to its own session (one agent worker, one session), so concurrency here is
across sessions, which is what group commit batches. After every append case the sessions' next
seq (read with an empty Append, which writes nothing) must equal the events the clients were
acknowledged: a mismatch is reported as an error of that case.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench import h2load
from bench.common import Measurement, Settings, append_request, page_events, writer_figures
from bench.load import StreamLoad, UnaryLoad, UnaryOutcome, run_stream, run_unary
from bench.procs import ServerProcess
from sessionlog.v1 import session_log_service_pb2 as pb

SERVICE = "/sessionlog.v1.SessionLogService"
APPEND = f"{SERVICE}/Append"
SINCE = f"{SERVICE}/Since"
FILL_BATCH = 1000
"""Events per Append while filling the Since session (setup, untimed)."""


@dataclass(frozen=True)
class AppendCase:
    """An append case: ``clients`` concurrent clients, ``events_per_call`` events per call."""

    number: int
    clients: int
    events_per_call: int

    @property
    def prefix(self) -> str:
        """Session ids of this case are ``<prefix>-<client index>``."""
        return f"c{self.number}"

    @property
    def h2load_prefix(self) -> str:
        """Session ids of this case under h2load are ``<h2load_prefix>-<client index>``."""
        return f"h2-{self.prefix}"

    @property
    def label(self) -> str:
        plural = "s" if self.clients > 1 else ""
        return f"{self.number} append {self.events_per_call} ev/call, {self.clients} client{plural}"


SEQUENTIAL = AppendCase(1, clients=1, events_per_call=1)
"""Case 1: one client on grpc's blocking API, one event per call, one call at a time."""
CONCURRENT = AppendCase(2, clients=16, events_per_call=1)
"""Case 2: 16 concurrent clients (asyncio tasks over several processes), one event per call."""
BATCHED = AppendCase(3, clients=4, events_per_call=100)
"""Case 3: 4 concurrent clients, 100 events per call."""


def append_load(settings: Settings, target: str, case: AppendCase, prefix: str = "") -> UnaryLoad:
    """Each client appends ``case.events_per_call`` events per call to its own session,
    ``<prefix>-<client index>`` (the case's prefix by default)."""
    prefix = prefix or case.prefix
    requests = tuple(
        append_request(f"{prefix}-{i}", case.events_per_call) for i in range(case.clients)
    )
    return UnaryLoad.for_run(
        settings,
        target,
        APPEND,
        requests,
        case.events_per_call,
        settings.client_processes,
        blocking=case.clients == 1,
    )


def run_append(
    settings: Settings, server: ServerProcess, case: AppendCase
) -> tuple[UnaryLoad, Measurement]:
    """Run an append case, then check that every acknowledged event is stored."""
    load = append_load(settings, server.address, case)
    outcome = run_unary(load, case.label, server.cpu_seconds)
    _verify(outcome, server.address, case.prefix)
    return load, outcome.measurement


def h2load_append_load(settings: Settings, target: str, case: AppendCase) -> UnaryLoad:
    """The case's load for h2load: client i appends to its own session, as in ``append_load``
    (h2load reads only the target, method, requests, events per call, duration and warm-up)."""
    return append_load(settings, target, case, prefix=case.h2load_prefix)


def run_append_h2load(
    settings: Settings, server: ServerProcess, case: AppendCase, work: Path
) -> tuple[UnaryLoad, Measurement]:
    """Run an append case with h2load as the client, then check the stored events.

    h2load cannot see a gRPC status, so each session's growth over the measured run is checked
    against what h2load counted as succeeded (see ``bench.h2load``).
    """
    load = h2load_append_load(settings, server.address, case)
    h2load.warm_up(load, work)
    sessions = [f"{case.h2load_prefix}-{i}" for i in range(case.clients)]
    with grpc.insecure_channel(server.address) as channel:
        before = [next_seq(channel, session) for session in sessions]
    seen: list[list[int]] = []

    def look() -> None:
        """The connections per worker, once every client's is there (or as many as came
        within a quarter of the run: a client that starts late is counted missing)."""
        deadline = time.monotonic() + load.duration / 4
        while True:
            spread = server.connections_per_worker()
            if sum(spread) >= case.clients or time.monotonic() > deadline:
                seen.append(spread)
                return
            time.sleep(0.02)

    writer_before = server.writer_counts()
    outcome = h2load.measure(
        load, f"{case.label} (h2load{server.workers_suffix})", server.cpu_seconds, work, look
    )
    measurement = outcome.measurement
    writer = writer_figures(writer_before, server.writer_counts(), measurement.seconds)
    with grpc.insecure_channel(server.address) as channel:
        after = [next_seq(channel, session) for session in sessions]
    for index, session in enumerate(sessions):
        grown = after[index] - before[index]
        counted = outcome.succeeded.get(index, 0) * case.events_per_call
        if not counted <= grown <= counted + case.events_per_call:
            measurement.errors += 1
            measurement.first_error = measurement.first_error or (
                f"session {session}: h2load counted {counted} events as succeeded, but "
                f"{grown} were stored (a gRPC error is an HTTP 200)"
            )
    measurement.details["stored_events_per_client"] = [
        a - b for a, b in zip(after, before, strict=True)
    ]
    spread = seen[0] if seen else []
    measurement.details.update(workers=server.workers, connections_per_worker=spread, writer=writer)
    _check_spread(measurement, server.workers, case.clients, spread)
    return load, measurement


SPREAD_ERROR_CHANCE = 1e-3
"""A worker without connections is an error when chance alone would leave one idle less
often than this (16 clients over 2 workers: 3e-5); with fewer clients it is only shown."""


def _check_spread(measurement: Measurement, workers: int, clients: int, spread: list[int]) -> None:
    """With enough clients every worker must hold some connections: the kernel spreads
    connections over the workers (SO_REUSEPORT), each to a worker chosen by a hash of its
    addresses. (Not every client need be connected at the moment of the count: in a short run
    some have finished, or not yet started.)"""
    if workers == 1:
        return
    problem = ""
    if len(spread) != workers:
        problem = f"{clients} clients, but the workers held {spread or 'no'} connections midway"
    elif 0 in spread and workers * (1 - 1 / workers) ** clients < SPREAD_ERROR_CHANCE:
        problem = f"{clients} clients, and a worker held none of them: {spread}"
    if problem:
        measurement.errors += 1
        measurement.first_error = measurement.first_error or problem


def run_since_page_h2load(
    settings: Settings, server: ServerProcess, clients: int, work: Path
) -> Measurement:
    """h2load clients reading the last page of one session of ``page_log_events`` events with a
    non-follow Since from the page's first seq, over and over (beside etcd's Range page).

    Nothing writes to the session during the run, so every reply is the same stream of
    SinceResponse frames: each client must have received whole replies for the calls h2load
    counted (``h2load.check_replies``); a gRPC error is an HTTP 200 with no such frames.
    """
    count = settings.page_log_events
    session = f"h2-page-{count}"
    with grpc.insecure_channel(server.address) as channel:
        stored = next_seq(channel, session)
    if stored == 0:
        fill_session(server.address, session, count)
    elif stored != count:
        raise RuntimeError(f"session {session} holds {stored} events, expected {count}")
    page = min(page_events(), count)
    request = pb.SinceRequest(session_id=session, seq=count - page).SerializeToString()
    with grpc.insecure_channel(server.address) as channel:
        replies = list(channel.unary_stream(SINCE)(request, timeout=60))
    events = sum(len(pb.SinceResponse.FromString(reply).events) for reply in replies)
    if events != page:
        raise RuntimeError(f"the last page of {session} holds {events} events, expected {page}")
    load = UnaryLoad.for_run(settings, server.address, SINCE, (request,) * clients, page, clients)
    name = f"since last page of {page:,} ev, {clients} client{'s' if clients > 1 else ''} (h2load)"
    h2load.warm_up(load, work)
    outcome = h2load.measure(load, name, server.cpu_seconds, work)
    h2load.check_replies(outcome, sum(len(h2load.frame(reply)) for reply in replies))
    outcome.measurement.details.update(page_events=page, log_events=count)
    return outcome.measurement


def since_catch_up(settings: Settings, server: ServerProcess) -> Measurement:
    """Case 4: store ``since_events`` events, then time non-follow Since reads from seq 0."""
    session = "c4"
    fill_session(server.address, session, settings.since_events)
    load = StreamLoad(
        target=server.address,
        method=SINCE,
        request=pb.SinceRequest(session_id=session, seq=0).SerializeToString(),
        expected_events=settings.since_events,
        runs=settings.since_runs,
    )
    return run_stream(
        load, f"4 since catch-up {settings.since_events // 1000}k ev", server.cpu_seconds
    )


def fill_session(target: str, session_id: str, count: int) -> None:
    """Append ``count`` benchmark events to a new session in batches (untimed setup)."""
    with grpc.insecure_channel(target) as channel:
        append = channel.unary_unary(APPEND)
        written = 0
        while written < count:
            size = min(FILL_BATCH, count - written)
            append(append_request(session_id, size), timeout=60)
            written += size
        stored = next_seq(channel, session_id)
    if stored != count:
        raise RuntimeError(f"filled session {session_id} holds {stored} events, expected {count}")


def next_seq(channel: grpc.Channel, session_id: str) -> int:
    """The session's next seq, read with an empty Append (which writes nothing)."""
    raw = channel.unary_unary(APPEND)(
        pb.AppendRequest(session_id=session_id).SerializeToString(), timeout=30
    )
    return int(pb.AppendResponse.FromString(raw).next_seq)


def _verify(outcome: UnaryOutcome, target: str, prefix: str) -> None:
    """Every acknowledged event must be stored: next_seq per session equals what was acked."""
    with grpc.insecure_channel(target) as channel:
        for index, acked in sorted(outcome.acknowledged.items()):
            stored = next_seq(channel, f"{prefix}-{index}")
            if stored != acked:
                outcome.measurement.errors += 1
                outcome.measurement.first_error = outcome.measurement.first_error or (
                    f"session {prefix}-{index}: {acked} events acknowledged, {stored} stored"
                )
