"""The retention sweep: which sessions are due (``sessionlog.retention`` decides), found through
indexes, and deleted through the same DeleteCommand as DeleteSession.

- Expired sessions come from the ``expiry`` index (unpinned sessions with an expire_time,
  soonest first), read from its start up to now.
- Idle sessions (``--retention-idle``) come from the ``recent`` index read from its oldest end,
  up to the idle bound; a pinned one there is read and skipped.

So a sweep reads at most ``SCAN_LIMIT`` index keys of each kind and deletes at most ``batch``
sessions of each kind, never walking every session. Each delete re-checks, inside its own write
transaction, that the session is still due (``still_due``), so a pin or a new expiry that
commits first keeps the session; a delete that commits first wins (a later write finds no
session). The erasure audit records the actor ``retention`` and the reason ("expired" or
"retention policy"); the change feed carries a DELETE like any DeleteSession, so replicas erase
the session too. The caller runs a sweep only where writes are accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import lmdb

from sessionlog import retention
from sessionlog.retention import Policy
from sessionlog.storage import damage, schema
from sessionlog.storage.indexes import load_record, update_time
from sessionlog.storage.reads import Txn
from sessionlog.storage.schema import SessionMeta
from sessionlog.storage.tables import Tables

SWEEP_BATCH = 500
"""Sessions of each kind one sweep deletes at most; the next sweep takes the rest."""
SCAN_LIMIT = 10_000
"""Index keys of each kind one sweep reads at most (pinned or not-ours ones are skipped)."""


@dataclass
class Swept:
    """What one sweep deleted."""

    expired: int = 0
    idle: int = 0
    events: int = 0


def expired(
    txn: lmdb.Transaction,
    tables: Tables,
    now_ns: int,
    limit: int,
    ours: Callable[[str], bool] = lambda _: True,
) -> list[str]:
    """Up to ``limit`` sessions ``ours`` accepts whose expire_time is at or before ``now_ns``,
    soonest first."""
    if tables.expiry is None:
        return []
    found: list[str] = []
    with damage.reading("the expiry index"):
        cursor = txn.cursor(db=tables.expiry)
        if not cursor.first():
            return found
        for read, raw in enumerate(cursor.iternext(keys=True, values=False)):
            stamp, session_id = schema.expiry_key_parts(bytes(raw))
            if stamp > now_ns or read == SCAN_LIMIT or len(found) == limit:
                break
            if ours(session_id):
                found.append(session_id)
    return found


def idle(
    txn: lmdb.Transaction,
    tables: Tables,
    now_ns: int,
    policy: Policy,
    limit: int,
    ours: Callable[[str], bool] = lambda _: True,
    below: bytes = b"",
) -> tuple[list[str], bytes]:
    """Up to ``limit`` unpinned sessions ``ours`` accepts whose update time is older than the
    policy's idle duration, oldest first (none when the policy keeps sessions forever), from
    the oldest end of ``recent`` or, given ``below``, from the key before it. Also where the
    next sweep resumes: the key after which this walk stopped for its ``SCAN_LIMIT`` (so that
    many pinned idle sessions cannot hold back the rest; the next walk starts at it), else b""
    (from the oldest end)."""
    if not policy.idle_ns:
        return [], b""
    found: list[str] = []
    with damage.reading("the recent index, for retention"):
        cursor = txn.cursor(db=tables.recent)
        placed = cursor.set_range(below) if below else cursor.last()
        if below and not placed:
            placed = cursor.last()  # past the end: nothing at or after it any more
        elif below and bytes(cursor.key()) > below:
            placed = cursor.prev()  # ``below`` itself is gone; the keys after it were read
        if not placed:
            return found, b""
        for read, raw in enumerate(cursor.iterprev(keys=True, values=False)):
            key = bytes(raw)
            stamp, session_id = schema.recent_key_parts(key)
            if stamp + policy.idle_ns > now_ns or len(found) == limit:
                return found, b""
            if read == SCAN_LIMIT:
                return found, key
            record = load_record(txn, tables, session_id)
            if (record is None or not record.pinned) and ours(session_id):
                found.append(session_id)
    return found, b""


def still_due(
    tables: Tables, policy: Policy, reason: str
) -> Callable[[Txn, str, SessionMeta, int], bool]:
    """The delete's re-check in its write transaction: the session is due, for ``reason``, at
    the commit's own time, as its record and update time stand there (one due for the other
    reason only is left for the walk that finds it, so the audit's reason is always true)."""

    def check(txn: Txn, session_id: str, meta: SessionMeta, now_ns: int) -> bool:
        record = load_record(txn, tables, session_id)
        now_due = retention.due(
            expire_time_ns=0 if record is None else record.expire_time_ns,
            pinned=record is not None and record.pinned,
            update_time_ns=update_time(meta, record),
            now_ns=now_ns,
            policy=policy,
        )
        return now_due == reason

    return check
