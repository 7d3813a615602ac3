"""Which encoder sends stored bytes faster: generated code for a mirror message, or the hand
encoder in ``sessionlog.wire``. In this process, no server: each path builds the same reply
bytes both ways (checked equal) and the table gives the best of several timed repeats.

    .venv/bin/python -m bench.encode

The server uses whichever wins per path (see ``sessionlog.mirrors``); bench/README.md records
the last run. Both encoders take their field numbers from the generated descriptors.
"""

from __future__ import annotations

import functools
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sessionlog import mirrors, wire
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1.event_pb2 import Event, EventType

REPEATS = 5
_SINCE = {f.name: f.number for f in pb.SinceResponse.DESCRIPTOR.fields}
_APPEND = {f.name: f.number for f in pb.AppendResponse.DESCRIPTOR.fields}
_DERIVE = {f.name: f.number for f in pb.DeriveMessagesResponse.DESCRIPTOR.fields}


@dataclass(frozen=True)
class Timing:
    path: str
    hand_us: float
    generated_us: float

    @property
    def winner(self) -> str:
        return "generated" if self.generated_us <= self.hand_us else "hand"


def _stored(count: int) -> list[bytes]:
    event = Event(seq=12345, type=EventType.EVENT_TYPE_USER_MESSAGE)
    event.time.FromNanoseconds(1_700_000_000_123_456_789)
    event.data.update({"content": "hello world, this is a message of moderate length"})
    return [event.SerializeToString()] * count


def _serialized(message_type: Any, **fields: Any) -> bytes:
    encoded: bytes = message_type(**fields).SerializeToString()
    return encoded


def _compare(path: str, hand: Callable[[], bytes], generated: Callable[[], bytes]) -> Timing:
    """Best of REPEATS timed runs each, hand and generated taking turns, after an untimed warm-up
    of both (a server's allocator is warm: a cold one makes the first large replies page-fault,
    whichever encoder made them)."""
    assert hand() == generated(), f"{path}: the two encoders disagree"
    started = timeit.default_timer()
    calls = 0
    while timeit.default_timer() - started < 0.05:
        hand(), generated()
        calls += 1
    best = {hand: float("inf"), generated: float("inf")}
    for _ in range(REPEATS):
        for encode in best:
            best[encode] = min(best[encode], timeit.timeit(encode, number=calls) / calls * 1e6)
    return Timing(path, best[hand], best[generated])


def measure() -> list[Timing]:
    """Since batches of 3,000 and of 3 stored events, an Append reply of one event, and a
    DeriveMessages reply of 3,000 messages."""
    timings = []
    for count in (3000, 3):
        events = _stored(count)
        timings.append(
            _compare(
                f"Since, {count} events",
                functools.partial(wire.length_delimited, _SINCE["events"], events),
                functools.partial(_serialized, mirrors.SinceResponse, events=events),
            )
        )
    one = _stored(1)
    timings.append(
        _compare(
            "Append reply, 1 event",
            lambda: (
                wire.length_delimited(_APPEND["events"], one)
                + wire.uint_field(_APPEND["next_seq"], 12346)
            ),
            lambda: mirrors.AppendResponse(events=one, next_seq=12346).SerializeToString(),
        )
    )
    messages, seqs = _stored(3000), list(range(3000))
    timings.append(
        _compare(
            "DeriveMessages, 3000 messages",
            lambda: (
                wire.length_delimited(_DERIVE["messages"], messages)
                + wire.packed_uints(_DERIVE["seqs"], seqs)
                + wire.uint_field(_DERIVE["event_count"], 3000)
            ),
            lambda: mirrors.DeriveMessagesResponse(
                messages=messages, seqs=seqs, event_count=3000
            ).SerializeToString(),
        )
    )
    return timings


def main() -> None:
    print(f"{'path':32} {'hand µs':>10} {'generated µs':>13}  faster")
    for t in measure():
        print(f"{t.path:32} {t.hand_us:10.1f} {t.generated_us:13.1f}  {t.winner}")


if __name__ == "__main__":
    main()
