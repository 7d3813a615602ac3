"""Open a stopped server's LMDB environment read-only and check the layout's invariants.

The invariants are the ones ``sessionlog.storage.schema`` writes down: every named database
exists; each session's events are exactly the keys (sid, 0) .. (sid, next_seq - 1); each stored
event carries the seq of its key; ``replace_generation`` counts the replace events; ``ids`` is the
reverse of ``sessions``; ``next_sid`` is past every sid; every request record points inside its
session's log.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from sessionlog import fold
from sessionlog.storage import schema
from sessionlog.storage.schema import AuditRecord, LeaseRecord, RequestRecord, SessionMeta
from sessionlog.v1.event_pb2 import Event


@dataclass
class EnvReport:
    """What the check saw."""

    sessions: int
    events: int
    requests: int


def check_environment(path: Path) -> EnvReport:
    """Open ``path`` read-only (no server may be running) and assert every invariant."""
    env = lmdb.open(str(path), readonly=True, max_dbs=len(schema.ALL_DBS), subdir=True)
    try:
        dbs = {name: env.open_db(name, create=False) for name in schema.ALL_DBS}
        with env.begin(buffers=False) as txn:
            return _check(txn, dbs)
    finally:
        env.close()


def _items(txn: lmdb.Transaction, db: Any) -> list[tuple[bytes, bytes]]:
    return [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)]


def _check(txn: lmdb.Transaction, dbs: dict[bytes, Any]) -> EnvReport:
    metas = {k.decode(): SessionMeta.decode(v) for k, v in _items(txn, dbs[schema.SESSIONS])}
    by_sid = {meta.sid: sid_name for sid_name, meta in metas.items()}
    assert len(by_sid) == len(metas), "two sessions share a sid"
    ids = {schema.read_u64(k): v.decode() for k, v in _items(txn, dbs[schema.IDS])}
    assert ids == by_sid, f"ids is not the reverse of sessions: {ids} vs {by_sid}"

    counters = dict(_items(txn, dbs[schema.COUNTERS]))
    if by_sid:
        assert schema.NEXT_SID in counters, "sessions exist but next_sid is missing"
        assert schema.read_u64(counters[schema.NEXT_SID]) > max(by_sid), "next_sid reuses a sid"

    seqs: defaultdict[int, list[int]] = defaultdict(list)
    replaces: defaultdict[int, int] = defaultdict(int)
    events = _items(txn, dbs[schema.EVENTS])
    for key, value in events:
        assert len(key) == 16, f"event key of {len(key)} bytes"
        sid, seq = schema.read_u64(key[:8]), schema.event_key_seq(key)
        assert sid in by_sid, f"events of sid {sid}, which no session owns"
        event = Event.FromString(value)
        assert event.seq == seq, f"event stored under seq {seq} says seq {event.seq}"
        seqs[sid].append(seq)
        replaces[sid] += fold.replace_range(event) is not None
    for sid, session_id in by_sid.items():
        meta = metas[session_id]
        assert seqs[sid] == list(range(meta.next_seq)), (
            f"session {session_id!r}: next_seq {meta.next_seq} but stored seqs "
            f"{_summary(seqs[sid])}"
        )
        assert replaces[sid] == meta.replace_generation, (
            f"session {session_id!r}: replace_generation {meta.replace_generation}, "
            f"{replaces[sid]} replace events stored"
        )

    requests = _items(txn, dbs[schema.REQUESTS])
    for key, value in requests:
        sid = schema.read_u64(key[:8])
        assert sid in by_sid, f"request record of sid {sid}, which no session owns"
        record = RequestRecord.decode(value)
        meta = metas[by_sid[sid]]
        assert record.first_seq + record.count <= meta.next_seq, "request record past the log"
        assert record.next_seq <= meta.next_seq, "request record's next_seq past the log"
    for _, value in _items(txn, dbs[schema.LEASES]):
        LeaseRecord.decode(value)
    for _, value in _items(txn, dbs[schema.AUDIT]):
        AuditRecord.decode(value)
    return EnvReport(sessions=len(metas), events=len(events), requests=len(requests))


def _summary(seqs: list[int]) -> str:
    if len(seqs) <= 10:
        return str(seqs)
    return f"[{seqs[0]}..{seqs[-1]}] ({len(seqs)} keys)"
