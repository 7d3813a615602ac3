"""The stored forms the writer produces by hand match what they stand for.

A session record is packed (it is read and written on every append) and the JSON form it replaced
is still read; a change record is encoded without building protobuf objects and must parse, and
serialize, exactly as the ``Change`` message it stands for.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sessionlog.storage import changes, schema
from sessionlog.storage.schema import SessionMeta
from sessionlog.storage.store import Store
from sessionlog.v1 import replication_service_pb2 as rpb
from tests.integration.helpers import user

METAS = [
    SessionMeta(sid=1),
    SessionMeta(
        sid=2**64 - 1,
        next_seq=2**63,
        replace_generation=7,
        create_time_ns=1_700_000_000_123_456_789,
        last_append_time_ns=1_700_000_001_000_000_000,
        parent_id="parent/\u00e9\u4e2d",
        parent_length=12,
    ),
    SessionMeta(sid=3, create_time_ns=-5, last_append_time_ns=-1),
]


@pytest.mark.parametrize("meta", METAS)
def test_session_record_round_trips(meta: SessionMeta) -> None:
    raw = meta.encode()
    assert raw[0] == schema.META_FORMAT
    assert SessionMeta.decode(raw) == meta
    assert SessionMeta.decode(memoryview(raw)) == meta


@pytest.mark.parametrize("meta", METAS)
def test_the_json_session_record_is_still_read(meta: SessionMeta) -> None:
    legacy = json.dumps(vars(meta), separators=(",", ":")).encode()
    assert SessionMeta.decode(legacy) == meta


def test_an_unknown_session_record_format_is_refused() -> None:
    raw = bytearray(SessionMeta(sid=1).encode())
    raw[0] = 9
    with pytest.raises(ValueError, match="format 9"):
        SessionMeta.decode(bytes(raw))


def test_a_store_written_with_json_records_keeps_working(store: Store) -> None:
    """A session whose record is still JSON is appended to, and comes back packed."""
    store.append("old", [user("one")])
    meta = store.meta("old")
    assert meta is not None
    with store.env.begin(write=True) as txn:
        legacy = json.dumps(vars(meta), separators=(",", ":")).encode()
        txn.put(b"old", legacy, db=store.tables.sessions)
    store.append("old", [user("two")])
    after = store.meta("old")
    assert after is not None
    assert (after.next_seq, after.sid) == (2, meta.sid)
    with store.env.begin() as txn:
        raw = txn.get(b"old", db=store.tables.sessions)
    assert raw is not None
    assert raw[0] == schema.META_FORMAT


class _Recorded:
    """What encode_change reads of a RecordingTxn."""

    def __init__(
        self,
        puts: list[tuple[str, bytes, bytes]],
        sid: int,
        first: int,
        count: int,
        deletes: list[tuple[str, bytes, bytes]] | None = None,
        erased_positions: list[int] | None = None,
    ):
        self.puts, self.event_sid, self.first_seq, self.event_count = puts, sid, first, count
        self.deletes = deletes or []
        self.erased_positions = erased_positions or []


CHANGES = [
    (1, "append", "s", 1_700_000_000_000_000_001, ([("sessions", b"s", b"\x01meta")], 4, 0, 1)),
    (2**40, "create", "", 0, ([], -1, 0, 0)),
    (
        3,
        "fork",
        "child/\u00e9",
        -1_000_000_001,
        ([("sessions", b"c", b""), ("ids", b"\x00" * 8, b"c" * 20000)], 9, 2**33, 300),
    ),
    (7, "lease", "x" * 200, 5, ([("leases", b"x" * 200, b'{"holder":"a"}')], -1, 0, 0)),
    (
        9,
        "delete",
        "gone",
        6,
        (
            [("erasures", b"k", b"{}")],
            -1,
            0,
            0,
            [("sessions", b"gone", b""), ("events", b"\x00" * 8, b"\x00" * 7 + b"\x01")],
            [1, 3, 2**40],
        ),
    ),
]


@pytest.mark.parametrize(("position", "kind", "session_id", "commit_ns", "recorded"), CHANGES)
def test_change_records_are_the_change_message(
    position: int,
    kind: str,
    session_id: str,
    commit_ns: int,
    recorded: tuple[Any, ...],
) -> None:
    raw = changes.encode_change(position, kind, session_id, commit_ns, _Recorded(*recorded))  # type: ignore[arg-type]
    puts, sid, first, count, *more = recorded
    deletes, erased_positions = (more[0], more[1]) if more else ([], [])
    expected = rpb.Change(
        position=position,
        kind=changes.KIND_BY_NAME[kind],
        session_id=session_id,
        first_seq=first,
        event_count=count,
        internal_id=max(sid, 0),
        puts=[rpb.StoragePut(table=t, key=k, value=v) for t, k, v in puts],
        deletes=[rpb.StorageDelete(table=t, key=k, end_key=e) for t, k, e in deletes],
        erased_positions=erased_positions,
    )
    expected.commit_time.FromNanoseconds(commit_ns)
    assert rpb.Change.FromString(raw) == expected
    assert raw == expected.SerializeToString()


def test_change_records_of_one_group_share_the_encoded_commit_time() -> None:
    """Records encoded one after another with the same commit time (one group) or another one
    (the next group) are each exactly the record encoded alone, first."""
    alone = {
        change[0]: changes.encode_change(*change[:4], _Recorded(*change[4]))  # type: ignore[arg-type]
        for change in CHANGES
    }
    for position, kind, session_id, commit_ns, recorded in CHANGES * 2:
        for _ in range(2):
            raw = changes.encode_change(position, kind, session_id, commit_ns, _Recorded(*recorded))  # type: ignore[arg-type]
            assert raw == alone[position]


def test_an_append_over_existing_event_keys_fails_and_writes_nothing(store: Store) -> None:
    """Events go to LMDB in one call; a key already taken (a broken invariant) fails the append
    instead of overwriting an acknowledged event, and its transaction is rolled back."""
    store.append("s", [user("zero")])
    meta = store.meta("s")
    assert meta is not None
    with store.env.begin(write=True) as txn:
        txn.put(schema.event_key(meta.sid, 2), b"planted", db=store.tables.events)
    with pytest.raises(RuntimeError, match="already exist"):
        store.append("s", [user("one"), user("two")])
    after = store.meta("s")
    assert after is not None
    assert after.next_seq == 1
    with store.env.begin() as txn:
        assert txn.get(schema.event_key(meta.sid, 1), db=store.tables.events) is None
        assert txn.get(schema.event_key(meta.sid, 2), db=store.tables.events) == b"planted"
