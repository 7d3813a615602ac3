"""Reading the change feed for FollowSessions: the changes of the sessions a stream follows.

A FollowSessions stream walks the same ``changes`` table a replica reads, but keeps only what a
reader of many sessions wants: for each change of a followed session its position and the events
it wrote (read from the events table, as ``changes.read_changes`` does), and a marker for each
deletion. What the walk never hands out:

- an erased placeholder of a deleted session: it names no session (``Change.erased``), so it is
  skipped before anything is read; the events of a redacted one are read as they are stored now,
  redacted;
- a lease or record change (no events): followers want events, and the position still advances
  past it (a redaction is sent as the events it rewrote, as stored now: redacted);
- a session the caller may not see (``admits``: the prefix, the token's prefix, the shard's own
  slots) or whose record does not match the filter as it stands at the read.

A walk reads at most ``max_records`` records and stops before the batch of events it returns
grows past ``max_bytes`` (the first change is kept whatever its size), so one read never holds
the event loop for long, and a stream behind catches up batch by batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import lmdb

from sessionlog import wire
from sessionlog.records import Filter
from sessionlog.storage import changes as feed
from sessionlog.storage import damage, schema
from sessionlog.storage.indexes import load_record, update_time
from sessionlog.storage.reads import load_meta, read_range
from sessionlog.storage.tables import Tables
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb

_CHANGE = {f.name: f.number for f in pb.FollowedChange.DESCRIPTOR.fields}
_RESPONSE = {f.name: f.number for f in pb.FollowSessionsResponse.DESCRIPTOR.fields}


@dataclass
class FollowedRead:
    """One walk of the feed: the changes kept, and how far it read."""

    changes: list[bytes] = field(default_factory=list)
    """Serialized FollowedChange messages, in feed order."""
    last: int = 0
    """The last position read (the start minus one when nothing was there)."""
    more: bool = False
    """Whether the walk stopped at a limit with records left after ``last``."""
    checksum: bytes = b""
    """The fingerprint of the record at ``last`` (``changes.fingerprint``); empty when the walk
    read nothing."""


def encode_followed(session_id: str, position: int, events: list[bytes], deleted: bool) -> bytes:
    """A FollowedChange from stored event bytes (no decode and re-encode of the events)."""
    name = session_id.encode()
    return b"".join(
        (
            wire.tag(_CHANGE["session_id"], wire.LENGTH_DELIMITED),
            wire.varint(len(name)),
            name,
            wire.uint_field(_CHANGE["position"], position),
            wire.length_delimited(_CHANGE["events"], events),
            wire.uint_field(_CHANGE["deleted"], int(deleted)),
        )
    )


def encode_response(
    changes: list[bytes],
    position: int,
    checksum: bytes,
    *,
    caught_up: bool = False,
    heartbeat: bool = False,
) -> bytes:
    """A FollowSessionsResponse holding serialized FollowedChange messages, with the
    fingerprint of the change at ``position``."""
    return b"".join(
        (
            wire.length_delimited(_RESPONSE["changes"], changes),
            wire.uint_field(_RESPONSE["position"], position),
            wire.uint_field(_RESPONSE["caught_up"], int(caught_up)),
            wire.uint_field(_RESPONSE["heartbeat"], int(heartbeat)),
            wire.length_delimited(_RESPONSE["position_checksum"], [checksum] if checksum else []),
        )
    )


def read_followed(
    txn: lmdb.Transaction,
    tables: Tables,
    start: int,
    admits: Callable[[str], bool],
    query: Filter,
    *,
    max_records: int,
    max_bytes: int,
) -> FollowedRead:
    """The followed changes from position ``start`` on (see the module docstring)."""
    out = FollowedRead(last=start - 1)
    total = 0
    cursor = txn.cursor(db=tables.changes)
    with damage.reading(f"change-feed record {start}", position=start):
        if not cursor.set_range(schema.u64(max(start, 1))):
            return out
    last: tuple[bytes, rpb.Change] | None = None
    scanned = 0
    while True:
        position = schema.read_u64(cursor.key())
        with damage.reading(f"change-feed record {position}", position=position):
            record = bytes(cursor.value())
            change = rpb.Change.FromString(record)
        kept = _kept(txn, tables, change, admits, query)
        if kept is not None:
            if out.changes and total + len(kept) > max_bytes:
                out.more = True
                break
            total += len(kept)
            out.changes.append(kept)
        out.last, last = position, (record, change)
        scanned += 1
        with damage.reading(f"change-feed record {position + 1}", position=position + 1):
            if not cursor.next():
                break
        if scanned >= max_records or total >= max_bytes:
            out.more = True
            break
    if last is not None:  # once per walk: a record from before checksums hashes its events
        out.checksum = feed.fingerprint(txn, tables, *last)
    return out


def _kept(
    txn: lmdb.Transaction,
    tables: Tables,
    change: rpb.Change,
    admits: Callable[[str], bool],
    query: Filter,
) -> bytes | None:
    """The FollowedChange of ``change`` when the stream follows it, else None."""
    session_id = change.session_id
    if not session_id or not admits(session_id):  # a delete's placeholder names no session
        return None
    if change.kind == rpb.CHANGE_KIND_DELETE:
        return encode_followed(session_id, change.position, [], True)
    rewritten = (
        [put.value for put in change.puts if put.table == "events"]
        if change.kind == rpb.CHANGE_KIND_REDACT
        else []
    )
    if not change.event_count and not rewritten:
        return None
    meta = load_meta(txn, tables, session_id)
    if meta is None:  # deleted since: its records are placeholders by now, or about to be
        return None
    if query.terms:
        record = load_record(txn, tables, session_id)
        if not query.matches(record, meta.parent_id, update_time(meta, record)):
            return None
    if rewritten:  # a redaction: the events it rewrote, as stored now
        return encode_followed(session_id, change.position, rewritten, False)
    stop = change.first_seq + change.event_count
    events = read_range(
        txn, tables, change.internal_id, change.first_seq, stop, session_id=session_id
    )
    if len(events) != change.event_count:
        raise damage.missing_events(session_id, change.first_seq + len(events), stop)
    return encode_followed(session_id, change.position, events, False)
