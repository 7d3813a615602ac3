"""The ``records`` table and its indexes (``recent``, ``labels``, ``children``, ``expiry``; see
``schema``):
the writes every command that creates, appends to or updates a session makes to keep them true.

Writes happen on the writer thread only (the helpers take its ``RecordingTxn``), so every index
move is part of the command's one change-feed record (a removal included: see ``recording``).
"""

from __future__ import annotations

from sessionlog import errors
from sessionlog.records import SessionRecord
from sessionlog.storage import damage, schema
from sessionlog.storage.reads import Txn, load_meta
from sessionlog.storage.recording import RecordingTxn
from sessionlog.storage.schema import SessionMeta
from sessionlog.storage.tables import Tables


def load_record(txn: Txn, tables: Tables, session_id: str) -> SessionRecord | None:
    raw = txn.get(session_id.encode(), db=tables.records)
    if raw is None:
        return None
    with damage.reading(f"the record of session '{session_id}'", session_id=session_id):
        return schema.decode_record(raw)


def update_time(meta: SessionMeta, record: SessionRecord | None) -> int:
    """A session's update_time: the later of its last append and its last UpdateSession."""
    updated = 0 if record is None else record.update_time_ns
    return max(meta.last_append_time_ns, updated)


def touch(
    txn: RecordingTxn, tables: Tables, session_id: str, before_ns: int | None, now_ns: int
) -> None:
    """Move the session's ``recent`` key after an append at ``now_ns``; ``before_ns`` is its
    last append before (None: a new session). Reads only the record's first 8 bytes."""
    updated = 0
    if before_ns is not None:
        raw = txn.get(session_id.encode(), db=tables.records)
        updated = 0 if raw is None else schema.read_u64(bytes(raw[:8]))
    new = max(now_ns, updated)
    if before_ns is not None:
        old = max(before_ns, updated)
        if old == new:
            return
        txn.remove(schema.recent_key(old, session_id), db=tables.recent)
    txn.put(schema.recent_key(new, session_id), b"", db=tables.recent)


OWNER_KEY = "/owner"
STATUS_KEY = "/status"
"""The ``labels`` keys under which owner and status are indexed too: no label key starts with
"/" (``records`` refuses an empty prefix), so they never meet a real label."""


def indexed_pairs(record: SessionRecord | None) -> dict[str, str]:
    """What the ``labels`` table holds for a record: its labels, its owner and its status."""
    if record is None:
        return {}
    pairs = dict(record.labels)
    if record.owner:
        pairs[OWNER_KEY] = record.owner
    if record.status:
        pairs[STATUS_KEY] = record.status
    return pairs


def expiry_key(session_id: str, record: SessionRecord | None) -> bytes | None:
    """The session's ``expiry`` key: only an unpinned record with an expire_time has one."""
    if record is None or record.pinned or not record.expire_time_ns:
        return None
    return schema.expiry_key(record.expire_time_ns, session_id)


def put_record(
    txn: RecordingTxn,
    tables: Tables,
    session_id: str,
    old: SessionRecord | None,
    new: SessionRecord,
) -> None:
    """Store ``new`` as the session's record and move its ``labels`` and ``expiry`` entries to
    match."""
    before, after = indexed_pairs(old), indexed_pairs(new)
    for key, value in before.items():
        if after.get(key) != value:
            txn.remove(_label_key(key, value, session_id), db=tables.labels)
    for key, value in after.items():
        if before.get(key) != value:
            txn.put(_label_key(key, value, session_id), b"", db=tables.labels)
    old_expiry, new_expiry = expiry_key(session_id, old), expiry_key(session_id, new)
    if old_expiry != new_expiry:
        if old_expiry is not None:
            txn.remove(old_expiry, db=tables.expiry)
        if new_expiry is not None:
            txn.put(new_expiry, b"", db=tables.expiry)
    txn.put(session_id.encode(), schema.encode_record(new), db=tables.records)


def inherit_owner(
    txn: Txn, tables: Tables, parent_id: str, record: SessionRecord | None
) -> SessionRecord | None:
    """A new child's record (a fork's or a sub-agent's) with its parent's owner when it names
    none: a child holds its parent's conversation (a fork copies its events), so erasing
    "everything of user X" by owner must reach it too."""
    if record is not None and record.owner:
        return record
    parent = load_record(txn, tables, parent_id)
    if parent is None or not parent.owner:
        return record
    inherited = SessionRecord() if record is None else record.copy()
    inherited.owner = parent.owner
    return inherited


def link_child(txn: RecordingTxn, tables: Tables, parent_id: str, child_id: str) -> None:
    txn.put(schema.child_prefix(parent_id) + child_id.encode(), b"", db=tables.children)


def _label_key(key: str, value: str, session_id: str) -> bytes:
    return schema.label_prefix(key, value) + session_id.encode()


def check_parent(txn: RecordingTxn, tables: Tables, parent_id: str, parent_seq: int | None) -> None:
    """Refuse a sub-agent child whose parent does not exist or whose seq is past its end."""
    parent = load_meta(txn, tables, parent_id)
    if parent is None:
        raise errors.SessionNotFound(
            f"parent session '{parent_id}' does not exist; create the parent first",
            session_id=parent_id,
            field="parent_session_id",
        )
    if parent_seq is not None and parent_seq >= parent.next_seq:
        raise errors.BoundaryOutOfRange(
            f"parent_seq {parent_seq} is past the end of session '{parent_id}', which has "
            f"{parent.next_seq} events; name the seq of the tool call that spawned the child",
            at_seq=parent_seq,
            next_seq=parent.next_seq,
        )
