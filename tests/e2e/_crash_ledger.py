"""What the crash test's writers sent and what they were told, for checking after each restart.

Every event a writer sends carries a unique ``uid`` in its data, so an event found in a log can be
traced back to the one write that sent it. A write ends in one of three outcomes:

- ``ACKED``: the server replied; the reply's event bytes are what the log must hold, forever;
- ``REJECTED``: the server answered with a sessionlog error (SEQ_CONFLICT), or the write was
  known lost (unacknowledged, absent after a restart, no request_id): none of it may ever appear;
- ``UNKNOWN``: the call failed without an answer (the server was killed): after the restart the
  whole batch is present once, contiguous and in order, or absent.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from sessionlog import wire
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb

APPEND = "/sessionlog.v1.SessionLogService/Append"
SESSION_NAMES = ("crash-{}-a", "crash-{}-b", "crash-{}-c", "crash-{}-é.d")
CYCLES_PER_EPOCH = 10
"""Writers move to fresh sessions every this many cycles, so no log grows without bound in a
long run (the reference fold the check uses is O(events x replaces))."""
CALL_SECONDS = 5.0

ACKED = "acked"
REJECTED = "rejected"
UNKNOWN = "unknown"

TYPES = (
    event_pb2.EVENT_TYPE_USER_MESSAGE,
    event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE,
    event_pb2.EVENT_TYPE_TOOL_RESULT,
    event_pb2.EVENT_TYPE_TOOL_CALL,
    event_pb2.EVENT_TYPE_STEP_START,
    event_pb2.EVENT_TYPE_STEP_END,
)


@dataclass
class Write:
    """One Append call and what became of it."""

    session_id: str
    sent: list[event_pb2.Event]
    request: bytes
    request_id: str
    outcome: str = UNKNOWN
    stored: list[bytes] = field(default_factory=list)
    """The events as stored (from the reply, or as found after a restart for an unknown one)."""
    failure: str = ""

    @property
    def uids(self) -> list[str]:
        return [str(e.data["uid"]) for e in self.sent]


class Ledger:
    """Every write of the run, shared by the writer threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writes: list[Write] = []
        self.next_seq_hint: dict[str, int] = {}
        self.sessions: list[str] = []
        """Every session written so far, oldest epoch first."""
        self.touched: set[str] = set()
        """Sessions written since the last check."""
        self.errors: Counter[str] = Counter()
        self.unexpected: list[str] = []

    def epoch_sessions(self, cycle: int) -> list[str]:
        """The sessions the writers of ``cycle`` append to (and note them as used)."""
        names = [name.format(cycle // CYCLES_PER_EPOCH) for name in SESSION_NAMES]
        for name in names:
            if name not in self.next_seq_hint:
                self.next_seq_hint[name] = 0
                self.sessions.append(name)
        return names

    def add(self, write: Write) -> None:
        with self.lock:
            self.writes.append(write)
            self.touched.add(write.session_id)

    def by_uid(self) -> dict[str, tuple[Write, int]]:
        return {uid: (w, i) for w in self.writes for i, uid in enumerate(w.uids)}


def split_events(reply: bytes) -> list[bytes]:
    """The bytes of each Event in a reply's ``repeated Event events = 1``, exactly as sent."""
    return wire.split_field(reply, 1)[1]


def build_events(rng: random.Random, uid_prefix: str) -> list[event_pb2.Event]:
    """One event or a batch of 2-20, mixed types, some replaces, some with a client time."""
    count = 1 if rng.random() < 0.5 else rng.randint(2, 20)
    events = []
    for i in range(count):
        event = event_pb2.Event(type=rng.choice(TYPES))
        data: dict[str, Any] = {"uid": f"{uid_prefix}.{i}", "content": f"c{i}", "n": i}
        if event.type == event_pb2.EVENT_TYPE_TOOL_RESULT:
            data["tool_call_id"] = f"call-{i}"
        if event.type == event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE and rng.random() < 0.1:
            # start 0 is never in the future, so this replace is always admissible
            event.surface_op.replace.start_seq = 0
            event.surface_op.replace.stop_seq = rng.randint(0, 6)
        if rng.random() < 0.2:
            event.time.CopyFrom(Timestamp(seconds=rng.randint(0, 2_000_000_000), nanos=i * 1000))
        event.data.update(data)
        events.append(event)
    return events


def outcome_of(error: grpc.RpcError) -> tuple[str, str]:
    """(REJECTED, reason) for an answer from the service; (UNKNOWN, code) when none came."""
    status = rpc_status.from_call(error)
    if status is not None and status.details:
        info = error_details_pb2.ErrorInfo()
        if status.details[0].Unpack(info) and info.domain == "sessionlog":
            return REJECTED, info.reason
    return UNKNOWN, error.code().name


class Writer(threading.Thread):
    """Appends until told to stop (or ``max_calls``), recording each call in the ledger."""

    def __init__(
        self,
        name: str,
        address: str,
        ledger: Ledger,
        sessions: list[str],
        seed: int,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.sessions = sessions
        self.address = address
        self.ledger = ledger
        self.rng = random.Random(seed)
        self.stop_flag = stop
        self.calls = 0
        self.max_calls = 5000

    def run(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            append = channel.unary_unary(
                APPEND, request_serializer=None, response_deserializer=None
            )
            while not self.stop_flag.is_set() and self.calls < self.max_calls:
                self.calls += 1
                self.one(append)

    def one(self, append: grpc.UnaryUnaryMultiCallable) -> None:
        rng = self.rng
        session_id = rng.choice(self.sessions)
        tag = f"{self.name}.{self.calls}.{time.monotonic_ns()}"
        request = pb.AppendRequest(session_id=session_id, events=build_events(rng, tag))
        if rng.random() < 0.5:
            request.request_id = f"rid-{tag}"
        if rng.random() < 0.3:
            with self.ledger.lock:
                request.expected_seq = self.ledger.next_seq_hint[session_id]
        write = Write(
            session_id,
            list(request.events),
            request.SerializeToString(),
            request.request_id,
        )
        self.ledger.add(write)
        try:
            reply: bytes = append(write.request, timeout=CALL_SECONDS)
        except grpc.RpcError as error:
            write.outcome, write.failure = outcome_of(error)
            with self.ledger.lock:
                self.ledger.errors[write.failure] += 1
                if write.outcome == REJECTED and write.failure != "SEQ_CONFLICT":
                    self.ledger.unexpected.append(f"{write.failure}: {error.details()}")
            return
        write.stored = split_events(reply)
        write.outcome = ACKED
        next_seq = pb.AppendResponse.FromString(reply).next_seq
        with self.ledger.lock:
            self.ledger.next_seq_hint[session_id] = max(
                self.ledger.next_seq_hint[session_id], next_seq
            )
