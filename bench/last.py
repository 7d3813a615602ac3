"""Case 11, reads from the end: the last 10 events and the last 10 messages of a long session,
each beside what the same read costs from the start today.

One session of ``last_events`` events (1,000,000 by default) shaped as case 6's "with replaces"
(every tenth event an assistant summary replacing the nine before it, so a tenth of the events
stay on the surface and the full view fits one reply) is written straight into a fresh LMDB
environment with the store's own code, in large batches and within ``last_fill_seconds`` (the
size reached is reported), then a server is started on it. Pairs:

- last 10 events: ``ListEvents`` with ``order_by "seq desc"``, page_size 10, beside ``Since``
  from seq 0 read to its end (the whole log: how a client found the last events before);
- last 10 messages: ``DeriveMessages`` with page_size 10 (the backwards fold), beside a full
  ``DeriveMessages`` (the fold of the whole log when cold, the memo when warm);
- last 10 messages from the memo: the same paged call once a full derive has built the memo;
- page back: 100 pages of 10 read back from the end, each with the token of the one after it
  (events, then messages, before the full derive: the walk goes on from where it stopped),
  the median page beside the same read from the start.

cold: the first call of its kind after the server started (no memo; the data file was just
written, so the OS page cache is warm either way); warm: the median of repeated calls. Calls
read whole replies as bytes, one at a time, from this process, with nothing else running.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench import procs
from bench.common import Measurement, Settings
from sessionlog.storage.store import Store, StoreConfig
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb

SERVICE = "/sessionlog.v1.SessionLogService"
SESSION = "last-reads"
PAGE = 10
PAGES_BACK = 100
"""Pages read back with tokens for the page-back rows (each one timed; the median is shown)."""
REPLACE_EVERY = 10
FILL_BATCH = 10_000
MAX_MESSAGE_BYTES = 64 << 20


def events(start: int, count: int) -> list[event_pb2.Event]:
    """Events ``start`` .. ``start + count - 1``: messages, and a summary every tenth."""
    out = []
    for seq in range(start, start + count):
        if seq % REPLACE_EVERY == REPLACE_EVERY - 1:
            event = event_pb2.Event(type=event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE)
            event.data.update({"content": f"summary of {seq - 9} to {seq - 1}"})
            event.surface_op.replace.start_seq = seq - (REPLACE_EVERY - 1)
            event.surface_op.replace.stop_seq = seq - 1
        else:
            kind = seq % 2 and event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE
            event = event_pb2.Event(type=kind or event_pb2.EVENT_TYPE_USER_MESSAGE)
            event.data.update({"content": f"message {seq}: hello world, a moderate length"})
        out.append(event)
    return out


def fill(data_dir: Path, size: int, budget_seconds: float) -> tuple[int, float]:
    """Write up to ``size`` events in batches of FILL_BATCH, stopping at the batch that passes
    ``budget_seconds``; the events written and the seconds it took."""
    started = time.perf_counter()
    store = Store(data_dir, StoreConfig(durability="nosync", map_size=8 << 30))
    written = 0
    try:
        while written < size and time.perf_counter() - started < budget_seconds:
            count = min(FILL_BATCH, size - written)
            store.append(SESSION, events(written, count))
            written += count
    finally:
        store.close()
    return written, time.perf_counter() - started


@dataclass(frozen=True)
class Pair:
    """A read from the end and the read from the start it replaces, both cold and warm."""

    name: str
    baseline: str
    cold_ms: float | None
    """None where there is no cold call (a read served by a memo another call built)."""
    warm_ms: float
    baseline_cold_ms: float
    baseline_warm_ms: float

    def measurement(self, events_in_log: int, fill_seconds: float) -> Measurement:
        measured = Measurement(
            name=self.name, events=PAGE, calls=1, seconds=self.warm_ms / 1000, client_cpu_seconds=0
        )
        measured.p50_ms = self.warm_ms
        measured.details.update(
            baseline=self.baseline,
            events_in_log=events_in_log,
            fill_seconds=fill_seconds,
            cold_ms=self.cold_ms,
            warm_ms=self.warm_ms,
            baseline_cold_ms=self.baseline_cold_ms,
            baseline_warm_ms=self.baseline_warm_ms,
            cold_ratio=self.baseline_cold_ms / self.cold_ms if self.cold_ms else None,
            warm_ratio=self.baseline_warm_ms / self.warm_ms if self.warm_ms else None,
        )
        return measured


def run_last(settings: Settings, work: Path) -> list[Measurement]:
    """Fill the session, start a server on it, measure the pairs."""
    data = work / "last-data"
    written, seconds = fill(data, settings.last_events, settings.last_fill_seconds)
    extra = ("--max-message-size", str(MAX_MESSAGE_BYTES))
    with procs.sessionlog_server(data, work / "last-server.log", extra, workers=1) as server:
        pairs = measure(server.address, written, settings.derive_calls, settings.last_full_calls)
    return [pair.measurement(written, seconds) for pair in pairs]


def measure(address: str, written: int, calls: int, full_calls: int) -> list[Pair]:
    """The pairs, in an order that keeps each cold figure cold: the paged reads before the full
    derive that builds the memo."""
    channel = grpc.insecure_channel(
        address,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    with channel:
        list_events = _unary(channel, "ListEvents")
        derive = _unary(channel, "DeriveMessages")
        since = channel.unary_stream(f"{SERVICE}/Since")
        last_events = pb.ListEventsRequest(session_id=SESSION, page_size=PAGE, order_by="seq desc")
        last_messages = pb.DeriveMessagesRequest(session_id=SESSION, page_size=PAGE)
        full = pb.DeriveMessagesRequest(session_id=SESSION)
        from_zero = pb.SinceRequest(session_id=SESSION).SerializeToString()

        def read_all() -> bytes:
            total = sum(len(batch) for batch in since(from_zero, timeout=300))
            return total.to_bytes(8, "big")

        check_events = _check_last_events(written)
        events_cold, events_warm = _cold_and_warm(lambda: list_events(last_events), calls)
        check_events(pb.ListEventsResponse.FromString(list_events(last_events)))
        events_back = _paging_back(list_events, last_events, pb.ListEventsResponse)
        walk_cold, walk_warm = _cold_and_warm(lambda: derive(last_messages), calls)
        messages_back = _paging_back(derive, last_messages, pb.DeriveMessagesResponse)
        since_cold, since_warm = _cold_and_warm(read_all, full_calls)
        full_cold, full_warm = _cold_and_warm(lambda: derive(full), full_calls)
        _, memo_warm = _cold_and_warm(lambda: derive(last_messages), calls)
        whole = pb.DeriveMessagesResponse.FromString(derive(full))
        paged = pb.DeriveMessagesResponse.FromString(derive(last_messages))
        if list(paged.seqs) != list(whole.seqs)[-PAGE:]:
            raise RuntimeError("the last messages differ from the end of the full derive")
    return [
        Pair(
            "11 last 10 events (ListEvents desc)",
            "Since from 0",
            events_cold,
            events_warm,
            since_cold,
            since_warm,
        ),
        Pair(
            f"11 events, page back (x{PAGES_BACK}, token)",
            "Since from 0",
            None,
            events_back,
            since_cold,
            since_warm,
        ),
        Pair(
            "11 last 10 messages (walk back)",
            "full DeriveMessages",
            walk_cold,
            walk_warm,
            full_cold,
            full_warm,
        ),
        Pair(
            f"11 messages, page back (x{PAGES_BACK}, token)",
            "full DeriveMessages",
            None,
            messages_back,
            full_cold,
            full_warm,
        ),
        Pair(
            "11 last 10 messages (memo warm)",
            "full DeriveMessages (memo)",
            None,
            memo_warm,
            full_warm,
            full_warm,
        ),
    ]


def _paging_back(send: Callable[[Any], bytes], first: Any, reply_type: Any) -> float:
    """The median milliseconds of each of PAGES_BACK pages read back from the end with the
    previous page's token (before any full derive: no memo serves them)."""
    request = type(first)()
    request.CopyFrom(first)
    times = []
    for _ in range(PAGES_BACK):
        started = time.perf_counter()
        reply = reply_type.FromString(send(request))
        times.append((time.perf_counter() - started) * 1000)
        if not reply.next_page_token:
            break
        request.page_token = reply.next_page_token
    return statistics.median(times)


def _unary(channel: grpc.Channel, method: str) -> Callable[[object], bytes]:
    call = channel.unary_unary(f"{SERVICE}/{method}")

    def send(request: object) -> bytes:
        reply: bytes = call(request.SerializeToString(), timeout=300)  # type: ignore[attr-defined]
        return reply

    return send


def _cold_and_warm(read: Callable[[], bytes], calls: int) -> tuple[float, float]:
    """The first call's milliseconds, and the median of ``calls`` more."""
    cold = _timed(read)
    return cold, statistics.median(_timed(read) for _ in range(max(1, calls)))


def _timed(read: Callable[[], bytes]) -> float:
    started = time.perf_counter()
    read()
    return (time.perf_counter() - started) * 1000


def _check_last_events(written: int) -> Callable[[pb.ListEventsResponse], None]:
    def check(reply: pb.ListEventsResponse) -> None:
        seqs = [e.seq for e in reply.events]
        if seqs != list(range(written - 1, written - 1 - PAGE, -1)):
            raise RuntimeError(f"ListEvents returned seqs {seqs[:3]}..., not the last {PAGE}")

    return check


def table(measurements: list[Measurement]) -> str:
    header = (
        f"{'case':<38}  {'cold ms':>8}  {'warm ms':>8}  {'from the start':<26}  "
        f"{'cold ms':>9}  {'warm ms':>9}  {'x cold':>8}  {'x warm':>8}"
    )
    lines = [header, "-" * len(header)]
    for m in measurements:
        d = m.details
        lines.append(
            f"{m.name:<38}  {_ms(d['cold_ms']):>8}  {_ms(d['warm_ms']):>8}  {d['baseline']:<26}  "
            f"{_ms(d['baseline_cold_ms']):>9}  {_ms(d['baseline_warm_ms']):>9}  "
            f"{_ratio(d['cold_ratio']):>8}  {_ratio(d['warm_ratio']):>8}"
        )
    return "\n".join(lines)


def note(measurements: list[Measurement]) -> str:
    if not measurements:
        return ""
    d = measurements[0].details
    return (
        f"One session of {d['events_in_log']:,} events (a summary every tenth), written in "
        f"{d['fill_seconds']:.0f} s. cold: the first call of its kind after the server started "
        "(no memo); warm: the median of repeated calls. x: how many times faster than the read "
        "from the start."
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}x"
