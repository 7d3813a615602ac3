"""Case 6, DeriveMessages: latency on sessions of 1,000 / 10,000 / 100,000 events.

Each size comes in two shapes: plain (alternating user and assistant messages: every event is
on the surface) and with replaces (every tenth event is an assistant summary replacing the nine
before it, so about a tenth of the events stay on the surface). The sessions are written straight
into a fresh LMDB environment with the store's own code (untimed setup, no fsync), then a server
is started on it, and for each session:

- cold: the first DeriveMessages after the server started (the fold is built from the log);
  measured once per start, over ``derive_restarts`` starts;
- memoized: the same call repeated with nothing appended in between (the memo answers);
- after one append: one event appended (untimed), then the call (the memo is extended by one).

Every call reads the whole reply as bytes (no decoding), through a channel that accepts the 64 MiB
replies the largest sessions need; the server runs with the same message limit. The client is the
bench process itself, one call at a time, with nothing else running.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Generator, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench import procs
from bench.common import Measurement, Settings, append_request
from bench.procs import ServerProcess
from sessionlog.storage.store import Store, StoreConfig
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb

SERVICE = "/sessionlog.v1.SessionLogService"
DERIVE = f"{SERVICE}/DeriveMessages"
APPEND = f"{SERVICE}/Append"
SIZES = (1_000, 10_000, 100_000)
REPLACE_EVERY = 10
MAX_MESSAGE_BYTES = 64 << 20
FILL_BATCH = 1000
WARM_SESSION = "derive-warmup"


@dataclass(frozen=True)
class DeriveSession:
    size: int
    replaces: bool

    @property
    def session_id(self) -> str:
        return f"derive-{self.size}{'-r' if self.replaces else ''}"

    @property
    def label(self) -> str:
        shape = "with replaces" if self.replaces else "no replaces"
        return f"6 derive {self.size // 1000}k ev, {shape}"


def sessions() -> list[DeriveSession]:
    return [DeriveSession(size, replaces) for size in SIZES for replaces in (False, True)]


def events_of(session: DeriveSession) -> Iterator[event_pb2.Event]:
    """The session's events in order: messages, and with replaces a summary every tenth."""
    for seq in range(session.size):
        if session.replaces and seq % REPLACE_EVERY == REPLACE_EVERY - 1:
            event = event_pb2.Event(type=event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE)
            event.data.update({"content": f"summary of {seq - 9} to {seq - 1}"})
            event.surface_op.replace.start_seq = seq - (REPLACE_EVERY - 1)
            event.surface_op.replace.stop_seq = seq - 1
        else:
            kind = seq % 2 and event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE
            event = event_pb2.Event(type=kind or event_pb2.EVENT_TYPE_USER_MESSAGE)
            event.data.update({"content": f"message {seq}: hello world, a moderate length"})
        yield event


def fill(data_dir: Path) -> None:
    """Write every derive session (and a one-event warm-up session) into a new environment."""
    store = Store(data_dir, StoreConfig(durability="nosync"))
    try:
        store.append(WARM_SESSION, list(events_of(DeriveSession(1, False))))
        for session in sessions():
            batch: list[event_pb2.Event] = []
            for event in events_of(session):
                batch.append(event)
                if len(batch) == FILL_BATCH:
                    store.append(session.session_id, batch)
                    batch = []
            if batch:
                store.append(session.session_id, batch)
    finally:
        store.close()


def run_derive(settings: Settings, work: Path) -> list[Measurement]:
    """Fill the sessions, then measure them across ``derive_restarts`` server starts."""
    data = work / "derive-data"
    fill(data)

    def servers() -> Generator[ServerProcess, None, None]:
        for _ in range(settings.derive_restarts):
            extra = ("--max-message-size", str(MAX_MESSAGE_BYTES))
            log = work / "derive-server.log"
            with procs.sessionlog_server(data, log, extra, workers=1) as server:
                yield server

    with closing(servers()) as started:
        return measure(settings, started)


def measure(
    settings: Settings,
    servers: Iterator[ServerProcess],
) -> list[Measurement]:
    """Cold, memoized and after-append latencies of each session; ``servers`` yields one freshly
    started server per cold measurement (the last one is also used for the warm figures)."""
    cold: dict[DeriveSession, list[float]] = {s: [] for s in sessions()}
    memoized: dict[DeriveSession, list[float]] = {}
    appended: dict[DeriveSession, list[float]] = {}
    messages: dict[DeriveSession, int] = {}
    for restart, server in enumerate(servers):
        with _channel(server.address) as channel:
            derive = channel.unary_unary(DERIVE)
            _call(derive, WARM_SESSION)  # the connection and the server's code paths, warm
            for session in sessions():
                seconds, reply = _timed(derive, session.session_id)
                cold[session].append(seconds)
                if restart == 0:
                    messages[session] = len(pb.DeriveMessagesResponse.FromString(reply).messages)
            if restart < settings.derive_restarts - 1:
                continue
            append = channel.unary_unary(APPEND)
            for session in sessions():
                memoized[session] = [
                    _timed(derive, session.session_id)[0] for _ in range(settings.derive_calls)
                ]
                appended[session] = []
                for _ in range(settings.derive_appends):
                    append(append_request(session.session_id, 1), timeout=30)
                    appended[session].append(_timed(derive, session.session_id)[0])
    return [_measurement(s, cold[s], memoized[s], appended[s], messages[s]) for s in sessions()]


def _measurement(
    session: DeriveSession,
    cold: list[float],
    memoized: list[float],
    appended: list[float],
    messages: int,
) -> Measurement:
    measurement = Measurement(
        name=session.label,
        events=messages * len(memoized),
        calls=len(memoized),
        seconds=sum(memoized),
        client_cpu_seconds=0.0,
    )
    measurement.set_latencies([s * 1000 for s in memoized])
    p50 = measurement.p50_ms or 0.0
    measurement.details.update(
        events_in_log=session.size,
        messages=messages,
        cold_ms=[s * 1000 for s in cold],
        cold_median_ms=statistics.median(cold) * 1000,
        after_append_p50_ms=statistics.median(appended) * 1000 if appended else None,
        memoized_us_per_message=p50 * 1000 / messages if messages else None,
    )
    return measurement


def _channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(
        address,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )


def _call(derive: grpc.UnaryUnaryMultiCallable, session_id: str) -> bytes:
    request = pb.DeriveMessagesRequest(session_id=session_id).SerializeToString()
    reply: bytes = derive(request, timeout=60)
    return reply


def _timed(derive: grpc.UnaryUnaryMultiCallable, session_id: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    reply = _call(derive, session_id)
    return time.perf_counter() - started, reply
