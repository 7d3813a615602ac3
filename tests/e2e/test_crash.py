"""kill -9 at random moments under concurrent appends: no acknowledged event is ever lost.

A real `sessionlog serve` process (default durability, sync) takes appends from several writer
threads: single events and batches of 2-20, with and without request ids, to several sessions,
some with expected_seq. After a random delay it is killed with SIGKILL; the LMDB environment is
then opened read-only and checked, the server restarted on the same data, and every write is
checked against what its caller was told (see ``_crash_ledger``):

- every acknowledged event is present with the seq, time and data the reply carried (byte for
  byte, as Since returns it), and seqs are dense from 0;
- an event whose append got no answer is present at most once, with its whole batch, or absent;
- retrying a request_id after the restart returns the original result without writing again;
- DeriveMessages and Surface equal a fresh fold over the events Since returns.

The quick default runs 5 kill cycles. For a long run set the environment:

    SESSIONLOG_CRASH_CYCLES=200 .venv/bin/python -m pytest tests/e2e/test_crash.py -s

SESSIONLOG_CRASH_SECONDS bounds the run's wall time (default: 5 s per cycle, at least 25 s) past
its first 3 cycles, which always run;
SESSIONLOG_CRASH_SEED picks the random schedule (default 1). `-s` prints the counts. Writers move
to fresh sessions every 10 cycles, so a long run keeps each log (and the reference fold the check
runs over it) moderate; every earlier session is still checked byte for byte after each restart.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from sessionlog import fold
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._crash_ledger import (
    ACKED,
    APPEND,
    CALL_SECONDS,
    REJECTED,
    UNKNOWN,
    Ledger,
    Write,
    Writer,
    outcome_of,
    split_events,
)
from tests.e2e._crash_lmdb import check_environment
from tests.e2e._proc import ServerProcess, free_port

pytestmark = pytest.mark.workers

CYCLES = int(os.environ.get("SESSIONLOG_CRASH_CYCLES", "5"))
BUDGET_SECONDS = float(os.environ.get("SESSIONLOG_CRASH_SECONDS", str(max(25.0, 5.0 * CYCLES))))
SEED = int(os.environ.get("SESSIONLOG_CRASH_SEED", "1"))
MIN_CYCLES = min(CYCLES, 3)
"""Run whatever the budget: the budget only stops a run early past these, so a busy machine
makes the test slower, never failed."""
WRITERS = 4
SINCE = "/sessionlog.v1.SessionLogService/Since"
REPLAYS_PER_CYCLE = 10


@dataclass
class Tally:
    """What the run got through, printed at the end."""

    cycles: int = 0
    acked_checked: int = 0
    unknown_found: int = 0
    unknown_absent: int = 0
    replays: int = 0
    retried_writes: int = 0


def stored_log(channel: grpc.Channel, session_id: str) -> list[bytes]:
    """Every stored event of a session, as the bytes Since sends."""
    since = channel.unary_stream(SINCE, request_serializer=None, response_deserializer=None)
    request = pb.SinceRequest(session_id=session_id).SerializeToString()
    return [raw for reply in since(request, timeout=30) for raw in split_events(reply)]


def same_event(sent: event_pb2.Event, stored: event_pb2.Event) -> bool:
    """Whether a stored event is the one sent (the server adds seq, and time when none was sent)."""
    return (
        stored.type == sent.type
        and stored.data == sent.data
        and stored.surface_op == sent.surface_op
        and (not sent.HasField("time") or stored.time == sent.time)
    )


def verify(channel: grpc.Channel, ledger: Ledger, tally: Tally) -> None:
    """Check every write in the ledger against the logs the restarted server serves, and the
    fold of every session written since the last check (the others have not changed)."""
    stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
    logs = {sid: stored_log(channel, sid) for sid in ledger.sessions}
    found: dict[str, tuple[str, int]] = {}
    for session_id, raws in logs.items():
        events = [event_pb2.Event.FromString(raw) for raw in raws]
        assert [e.seq for e in events] == list(range(len(events))), f"{session_id}: seq gap"
        session = stub.GetSession(pb.GetSessionRequest(session_id=session_id)).session
        assert session.event_count == len(events), f"{session_id}: event_count != log length"
        for event in events:
            uid = str(event.data["uid"])
            assert uid not in found, f"event {uid} stored twice: {found[uid]}, {session_id}"
            found[uid] = (session_id, event.seq)
        if session_id in ledger.touched:
            check_fold(stub, session_id, events)

    by_uid = ledger.by_uid()
    strays = set(found) - set(by_uid)
    assert not strays, f"events no writer sent: {sorted(strays)[:5]}"
    for write in ledger.writes:
        places = [found.get(uid) for uid in write.uids]
        if write.outcome == ACKED:
            first = write_seq(write)
            log = logs[write.session_id]
            for i, raw in enumerate(write.stored):
                assert first + i < len(log), f"acked seq {first + i} of {write.session_id} lost"
                assert log[first + i] == raw, f"acked event {write.uids[i]} changed or moved"
            tally.acked_checked += len(write.stored)
        elif write.outcome == REJECTED:
            assert places == [None] * len(places), f"rejected write {write.uids[0]} was stored"
        else:
            settle_unknown(write, places, logs, tally)


def write_seq(write: Write) -> int:
    seq: int = event_pb2.Event.FromString(write.stored[0]).seq
    return seq


def settle_unknown(
    write: Write,
    places: list[tuple[str, int] | None],
    logs: dict[str, list[bytes]],
    tally: Tally,
) -> None:
    """An unanswered write is all there once, contiguous and as sent, or not there at all."""
    if all(p is None for p in places):
        tally.unknown_absent += 1
        if not write.request_id:  # nothing can write it any more: it must never appear
            write.outcome = REJECTED
        return
    assert None not in places, f"batch {write.uids[0]} stored in part: {places}"
    sessions = {p[0] for p in places if p is not None}
    seqs = [p[1] for p in places if p is not None]
    assert sessions == {write.session_id}, f"batch {write.uids[0]} went to {sessions}"
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"batch split up: {seqs}"
    stored = logs[write.session_id][seqs[0] : seqs[0] + len(seqs)]
    for sent, raw in zip(write.sent, stored, strict=True):
        assert same_event(sent, event_pb2.Event.FromString(raw)), f"{write.uids[0]} altered"
    write.stored = stored
    write.outcome = ACKED  # committed: from now on it must stay exactly as found
    tally.unknown_found += 1


def check_fold(
    stub: pb_grpc.SessionLogServiceStub, session_id: str, events: list[event_pb2.Event]
) -> None:
    """DeriveMessages and Surface equal a fresh fold over the log."""
    derived = stub.DeriveMessages(pb.DeriveMessagesRequest(session_id=session_id))
    surface = fold.fold_surface(events)
    assert list(derived.messages) == fold.derive_messages(events), f"{session_id}: messages"
    assert list(derived.seqs) == [e.seq for e in surface], f"{session_id}: message seqs"
    assert derived.event_count == len(events)
    served = stub.Surface(pb.SurfaceRequest(session_id=session_id))
    assert list(served.events) == surface, f"{session_id}: surface"


def call_append(append: grpc.UnaryUnaryMultiCallable, request: bytes) -> tuple[bytes, str]:
    """(reply, "") on success; (b"", reason or status code) on failure."""
    try:
        reply: bytes = append(request, timeout=CALL_SECONDS)
    except grpc.RpcError as error:
        return b"", outcome_of(error)[1]
    return reply, ""


def retry_request_ids(
    channel: grpc.Channel, ledger: Ledger, rng: random.Random, tally: Tally
) -> None:
    """Retry unanswered request ids, and a sample of answered ones: each replay returns the
    first result and writes nothing; an id that never landed writes once now."""
    append = channel.unary_unary(APPEND, request_serializer=None, response_deserializer=None)
    stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
    pending = [w for w in ledger.writes if w.request_id and w.outcome == UNKNOWN]
    answered = [w for w in ledger.writes if w.request_id and w.outcome == ACKED]
    sample = rng.sample(answered, min(REPLAYS_PER_CYCLE, len(answered)))
    for write in pending + sample:
        before = stub.GetSession(pb.GetSessionRequest(session_id=write.session_id)).session
        reply, refusal = call_append(append, write.request)
        if refusal:
            assert refusal == "SEQ_CONFLICT", f"retry of {write.request_id} failed: {refusal}"
            assert write.outcome == UNKNOWN, "a replay of an acknowledged write was refused"
            write.outcome = REJECTED
            continue
        after = stub.GetSession(pb.GetSessionRequest(session_id=write.session_id)).session
        events = split_events(reply)
        if write.outcome == ACKED:
            assert events == write.stored, f"replay of {write.request_id} differs from the first"
            assert after.event_count == before.event_count, "a replay wrote again"
            tally.replays += 1
        else:
            assert after.event_count == before.event_count + len(events), "retry wrote wrongly"
            write.stored, write.outcome = events, ACKED
            ledger.touched.add(write.session_id)
            tally.retried_writes += 1


@pytest.mark.timeout(max(300, int(BUDGET_SECONDS * 2) + 60))
def test_acknowledged_appends_survive_repeated_kill_9(tmp_path: Path) -> None:
    """Across many SIGKILLs mid-append no acknowledged event is lost, changed or duplicated."""
    data = tmp_path / "data"
    ledger, tally, rng = Ledger(), Tally(), random.Random(SEED)
    deadline = time.monotonic() + BUDGET_SECONDS
    for cycle in range(CYCLES + 1):
        address = f"127.0.0.1:{free_port()}"
        server = ServerProcess(["--data", str(data), "--listen", address], cwd=tmp_path)
        with server:
            server.wait_serving(address)
            with grpc.insecure_channel(address) as channel:
                verify(channel, ledger, tally)
                ledger.touched.clear()
                retry_request_ids(channel, ledger, rng, tally)
            if cycle == CYCLES or (cycle >= MIN_CYCLES and time.monotonic() > deadline):
                assert server.stop() == 0
                report = check_environment(data)
                break
            stop = threading.Event()
            sessions = ledger.epoch_sessions(cycle)
            writers = [
                Writer(f"w{cycle}.{n}", address, ledger, sessions, rng.randrange(1 << 30), stop)
                for n in range(WRITERS)
            ]
            for writer in writers:
                writer.start()
            time.sleep(rng.uniform(0.05, 0.8))
            server.kill()
            stop.set()
            for writer in writers:
                writer.join(CALL_SECONDS * 2)
                assert not writer.is_alive(), f"writer {writer.name} hung"
        check_environment(data)
        tally.cycles += 1
        assert not ledger.unexpected, f"unexpected rejections: {ledger.unexpected[:3]}"
    assert tally.cycles >= MIN_CYCLES, f"only {tally.cycles} cycles"
    acked = sum(len(w.stored) for w in ledger.writes if w.outcome == ACKED)
    assert acked > 0, "no append was ever acknowledged"
    print(
        f"\ncrash: {tally.cycles} SIGKILL cycles survived, {tally.acked_checked} acknowledged "
        f"event checks ({acked} distinct events, {report.events} stored), "
        f"{len(ledger.writes)} appends, unanswered: {tally.unknown_found} found whole / "
        f"{tally.unknown_absent} absent, {tally.replays} replays, {tally.retried_writes} "
        f"retried ids written, errors {dict(ledger.errors)}, seed {SEED}"
    )
