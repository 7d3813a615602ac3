"""Reads inside a transaction, shared by the store, the commands and the change feed: a
session's record, its lease, and a range of its stored events.

Each takes the transaction it runs in (a read transaction, or the writer's own), so a command
sees its own group's earlier writes. LMDB meeting a damaged page raises DataCorrupted naming
what was being read.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any, cast

import lmdb

from sessionlog.storage import damage, schema
from sessionlog.storage.recording import RecordingTxn
from sessionlog.storage.schema import LeaseRecord, SessionMeta
from sessionlog.storage.tables import Tables

Txn = lmdb.Transaction | RecordingTxn
"""A read transaction, or the writer's recording one (a command reads what its group wrote)."""


# load_meta and load_lease run on every append: a plain try costs nothing until damage is met,
# where ``damage.reading`` would build its message and enter a context every time.


def load_meta(txn: Txn, tables: Tables, session_id: str) -> SessionMeta | None:
    try:
        raw = txn.get(session_id.encode(), db=tables.sessions)
        return None if raw is None else SessionMeta.decode(raw)
    except damage.DAMAGE as exc:
        what = f"the record of session '{session_id}'"
        raise damage.corrupted(what, exc, session_id=session_id) from None


def load_lease(txn: Txn, tables: Tables, session_id: str) -> LeaseRecord | None:
    try:
        raw = txn.get(session_id.encode(), db=tables.leases)
        return None if raw is None else LeaseRecord.decode(raw)
    except damage.DAMAGE as exc:
        what = f"the lease of session '{session_id}'"
        raise damage.corrupted(what, exc, session_id=session_id) from None


def read_range(
    txn: Txn,
    tables: Tables,
    sid: int,
    start: int,
    stop: int | None = None,
    max_bytes: int = 1 << 62,
    session_id: str = "",
) -> list[bytes]:
    """Stored events of ``sid`` with start <= seq < stop: the first one whatever its size, then
    more while their total stays within ``max_bytes``. One cursor walk over a contiguous key
    range: O(events returned). LMDB finding a damaged page raises DataCorrupted naming
    ``session_id`` (or the sid). The values are not decoded here.

    Seqs are dense, so the events wanted are the ``stop - start`` values from the start key on,
    read without looking at their keys (no key copy or compare per event). A ``stop`` that is
    None or past the end is first clipped to the session's last stored seq (one seek).
    """
    name = f"session '{session_id}'" if session_id else f"the session of internal id {sid}"
    with damage.reading(f"events from seq {start} of {name}", session_id=session_id, seq=start):
        return _read_range(txn, tables, sid, start, stop, max_bytes)


def _read_range(
    txn: Txn, tables: Tables, sid: int, start: int, stop: int | None, max_bytes: int
) -> list[bytes]:
    if stop is not None and stop <= start:
        return []
    cursor = txn.cursor(db=tables.events)
    if stop is None or not cursor.set_key(schema.event_key(sid, stop - 1)):
        stored = _stored_stop(cursor, sid)
        stop = stored if stop is None else min(stop, stored)
        if stop <= start:
            return []
    if not cursor.set_key(schema.event_key(sid, start)):
        return _read_range_walk(cursor, sid, start, stop, max_bytes)
    values: Iterator[Any] = cursor.iternext(keys=False)
    if type(cursor.value()) is not bytes:
        # A transaction opened with buffers=True: copy each value out as it is read, which lets
        # py-lmdb reuse its buffer object (keeping every buffer alive first is ~3x slower).
        values = map(bytes, values)
    want = stop - start
    if max_bytes >= want * _MAX_VALUE_BYTES:
        out: list[Any] = list(islice(values, want))
        pulled = len(out)
    else:
        out, pulled = _take_within(values, want, max_bytes)
    # The cursor stands on the last value pulled: with a dense log, seq start + pulled - 1.
    # Anything else (a gap: an invariant broken) is read key by key instead.
    if cursor.key() != schema.event_key(sid, start + pulled - 1):
        return _read_range_walk(cursor, sid, start, stop, max_bytes)
    return out


_MAX_VALUE_BYTES = 1 << 32
"""No stored value is this large: a budget this big per event never cuts a read short."""


def _take_within(values: Iterator[Any], want: int, max_bytes: int) -> tuple[list[Any], int]:
    """Up to ``want`` values: the first whatever its size, then more while the total fits.

    Returns the values kept and how many were pulled from ``values`` (one more than kept when
    the budget cut the read). Reads at most one value past the budget, whatever the sizes; a
    plain loop here measured as fast as reading in chunks and trimming them.
    """
    out: list[Any] = []
    append = out.append
    total = 0
    for value in islice(values, want):
        total += len(value)
        if total > max_bytes and out:
            return out, len(out) + 1
        append(value)
    return out, len(out)


def _stored_stop(cursor: lmdb.Cursor, sid: int) -> int:
    """One past the last seq stored for ``sid`` (0 when none), found by seeking."""
    positioned = cursor.set_range(schema.event_key(sid + 1, 0))
    positioned = cursor.prev() if positioned else cursor.last()
    if not positioned:
        return 0
    key = bytes(cursor.key())
    if key[:8] != schema.u64(sid):
        return 0
    return schema.event_key_seq(key) + 1


def _read_range_walk(
    cursor: lmdb.Cursor, sid: int, start: int, stop: int, max_bytes: int
) -> list[bytes]:
    """read_range key by key: the reference, used only when the log is not dense."""
    out: list[bytes] = []
    total = 0
    end_key = schema.event_key(sid, stop)
    if not cursor.set_range(schema.event_key(sid, start)):
        return out
    for key, value in cursor:
        if bytes(key) >= end_key:
            break
        total += len(value)
        if out and total > max_bytes:
            break
        out.append(bytes(value))
    return out


def read_range_desc(
    txn: Txn,
    tables: Tables,
    sid: int,
    stop: int,
    count: int,
    max_bytes: int = 1 << 62,
    session_id: str = "",
) -> list[bytes]:
    """Up to ``count`` stored events of ``sid`` from seq ``stop - 1`` down, newest first: the
    first one whatever its size, then more while their total stays within ``max_bytes``. One
    backwards cursor walk over a contiguous key range: O(events returned). ``stop`` must not
    pass the session's next seq (the caller read it in the same transaction); the values are
    not decoded here, and a gap (an invariant broken) raises DataCorrupted."""
    out: list[bytes] = []
    if stop <= 0 or count <= 0:
        return out
    name = f"session '{session_id}'" if session_id else f"the session of internal id {sid}"
    with damage.reading(f"events before seq {stop} of {name}", session_id=session_id, seq=stop):
        cursor = txn.cursor(db=tables.events)
        if not cursor.set_key(schema.event_key(sid, stop - 1)):
            raise damage.missing_events(session_id or str(sid), stop - 1, stop)
        walked = list(islice(cursor.iterprev(keys=False), min(count, stop)))
        # Keys are of one width and unique, so the keys walked back from seq stop - 1 are dense
        # exactly when the last is seq stop - len(out)'s (a walk off the table ends on no key):
        # one comparison, not one a key
        if cursor.key() != schema.event_key(sid, stop - len(walked)):
            for _ in islice(walk_desc(txn, tables, sid, stop, session_id), len(walked) + 1):
                pass  # walked again key by key, to name the first missing seq
            raise damage.missing_events(session_id or str(sid), stop - len(walked), stop)
    if type(walked[0]) is bytes:  # a transaction without buffers: the values are bytes
        out = cast("list[bytes]", walked)
    else:
        out = [bytes(value) for value in walked]
    if len(out) > 1 and sum(map(len, out)) > max_bytes:  # keep the first, then what fits
        kept, total = 1, len(out[0])
        while total + len(out[kept]) <= max_bytes:
            total += len(out[kept])
            kept += 1
        del out[kept:]
    return out


def walk_desc(
    txn: Txn, tables: Tables, sid: int, stop: int, session_id: str = ""
) -> Iterator[tuple[int, bytes]]:
    """(seq, stored bytes) of ``sid``'s events from ``stop - 1`` down to 0, read lazily by one
    cursor walking backwards. Seqs are dense; a key out of place raises DataCorrupted naming
    the seq that should have been there."""
    if stop <= 0:
        return
    cursor = txn.cursor(db=tables.events)
    if not cursor.set_key(schema.event_key(sid, stop - 1)):
        raise damage.missing_events(session_id or str(sid), stop - 1, stop)
    seq = stop - 1
    while True:
        value = cursor.value()
        yield seq, value if type(value) is bytes else bytes(value)
        if seq == 0:
            return
        seq -= 1
        if not cursor.prev() or cursor.key() != schema.event_key(sid, seq):
            raise damage.missing_events(session_id or str(sid), seq, seq + 1)
