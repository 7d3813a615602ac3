"""The history identity of a data folder: which lineage of the change feed it holds.

A *history id* is a random id, kept in the ``counters`` table beside where it began (the feed
position it started at). It is made when a folder is first opened, and made anew when the
folder's history forks from the one it continued:

- **restored**: the data file is not the one the folder last held (its instance is not the
  marker's, see ``folder``): a backup was restored (or a file copied in). Whatever the old file
  went on to write after the backup is not in this one.
- **promoted**: a folder last opened as a replica is opened as a primary. Its old primary may
  still hold changes it never received.

A replica's data is its primary's history, so a replica takes its primary's id once the primary
has accepted its position (see ``service.replication``). Ids are informational: what proves two
stores agree is the chained checksum of their records at one position (``changes``); the id
tells people and logs *that* a history changed, and where.

None of these keys travels in the change feed: they describe this folder, not the data.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import lmdb

from sessionlog.storage import changes, folder, leadership, schema
from sessionlog.storage.tables import Tables

log = logging.getLogger(__name__)


CREATED, OPENED, RESTORED, PROMOTED = "created", "opened", "restored", "promoted"


@dataclass(frozen=True)
class Identity:
    history_id: str
    history_start: int
    """The feed position this history id began after (0: from the start)."""
    opened_as: str
    """How this open found the folder: created, opened, restored or promoted."""


def new_history_id() -> str:
    return secrets.token_hex(8)


def read(txn: lmdb.Transaction, tables: Tables) -> tuple[str, int]:
    """The folder's (history id, start position); ("", 0) before it has one."""
    raw = txn.get(schema.HISTORY_ID, db=tables.counters)
    start = txn.get(schema.HISTORY_START, db=tables.counters)
    return (
        "" if raw is None else bytes(raw).decode(),
        0 if start is None else schema.read_u64(start),
    )


def put_history(txn: lmdb.Transaction, tables: Tables, history_id: str, start: int) -> None:
    txn.put(schema.HISTORY_ID, history_id.encode(), db=tables.counters)
    txn.put(schema.HISTORY_START, schema.u64(start), db=tables.counters)


def reconcile(
    env: lmdb.Environment,
    tables: Tables,
    path: Path,
    marker: folder.Marker | None,
    replica_of: str,
    elected: bool = False,
) -> Identity:
    """Work out (and record) the folder's history at open: new, the same, restored, promoted.

    ``elected``: the folder's role comes from an election (a cluster member): the open leaves
    the leadership record and the followed primary as they are, and a former replica is not
    promoted (the election's leader takes its epoch, see ``leadership.elected``).

    Runs once, before the writer starts, with the folder lock held. The marker is written before
    the environment, naming the instance it replaces, so a crash between the two is never read
    as a restore; once the environment has committed, the marker names the new instance alone.
    """
    instance = folder.new_instance()
    with env.begin(write=True) as txn:
        history_id, start = read(txn, tables)
        raw = txn.get(schema.INSTANCE, db=tables.counters)
        held = "" if raw is None else bytes(raw).decode()
        follows = txn.get(schema.FOLLOWS, db=tables.counters)
        position = changes.head(txn, tables)[0]
        opened_as = OPENED
        if not history_id:
            opened_as = CREATED
        elif marker is not None and not marker.knows(held):
            opened_as = RESTORED
        elif follows is not None and not replica_of and not elected:
            opened_as = PROMOTED
        if opened_as != OPENED:
            history_id, start = new_history_id(), position
            put_history(txn, tables, history_id, start)
        if replica_of:
            txn.put(schema.FOLLOWS, replica_of.encode(), db=tables.counters)
        elif follows is not None and not elected:
            txn.delete(schema.FOLLOWS, db=tables.counters)
        record = leadership.read(txn, tables)
        opened = record if elected else _leadership_at_open(record, opened_as, replica_of, position)
        if opened != record:
            leadership.write(txn, tables, opened)
        folder.write_marker(
            path,
            folder.Marker(created=_created(marker), instance=instance, previous_instance=held),
        )
        txn.put(schema.INSTANCE, instance.encode(), db=tables.counters)
    # Committed: from now on only this instance is the folder's own. (Leaving the previous one
    # accepted would let a copy of the file from one open ago pass for the current one.)
    folder.write_marker(
        path, folder.Marker(created=_created(marker), instance=instance, previous_instance="")
    )
    identity = Identity(history_id, start, opened_as)
    _log(identity, position, None if follows is None else bytes(follows).decode())
    return identity


def _leadership_at_open(
    record: leadership.Leadership, opened_as: str, replica_of: str, position: int
) -> leadership.Leadership:
    """The leadership record as this open leaves it: a replica follows ``replica_of`` (or the
    primary it turned to by itself from that same ``replica_of``: ``Leadership.turned_from``); a
    former replica opened as a primary is promoted (a new epoch, as ``admin promote`` takes one); a
    fenced primary stays fenced, whatever it is started as, until it rejoins."""
    if replica_of:
        if (
            record.role == leadership.REPLICA
            and record.turned_from == replica_of
            and record.primary
        ):
            log.warning(
                "this replica turned from its --replica-of %s (deposed) to %s by itself, and "
                "follows %s: change --replica-of to it",
                replica_of,
                record.primary,
                record.primary,
                extra={"replica_of": replica_of, "primary": record.primary, "epoch": record.epoch},
            )
            return record
        return replace(record, role=leadership.REPLICA, primary=replica_of, turned_from="")
    if opened_as == PROMOTED or record.role == leadership.REPLICA:
        promoted = leadership.promoted(record, position + 1)
        log.warning(
            "a former replica starts as a primary: it takes a new epoch",
            extra={"epoch": promoted.epoch, "first_position": position + 1},
        )
        return promoted
    if record.role == leadership.FENCED:
        log.warning(
            "this folder was deposed by a newer epoch: it refuses every write until it rejoins "
            "(sessionlog replica rejoin --primary NEW)",
            extra={"epoch": record.epoch, "primary": record.primary},
        )
    return record


def _created(marker: folder.Marker | None) -> str:
    return marker.created if marker is not None else folder.now_iso()


def _log(identity: Identity, position: int, followed: str | None) -> None:
    fields = {"history_id": identity.history_id, "position": position}
    if identity.opened_as == RESTORED:
        log.warning(
            "the data file is not the one this folder last held (restored from a backup?): "
            "it starts a new history",
            extra=fields,
        )
    elif identity.opened_as == PROMOTED:
        log.warning(
            "this folder was a replica and now serves as a primary: it starts a new history",
            extra={**fields, "previous_primary": followed or ""},
        )
    elif identity.opened_as == CREATED and position:
        log.info("no history id yet (a store from an older version): made one", extra=fields)


def stamp_copy(env: lmdb.Environment, tables: Tables) -> None:
    """Mark a copy (a backup) as a file no folder has held yet, so that restoring it starts a
    new history instead of passing for the folder's own data file."""
    with env.begin(write=True) as txn:
        txn.put(schema.INSTANCE, b"copy-" + folder.new_instance().encode(), db=tables.counters)


class AdoptHistoryCommand:
    """A replica takes its primary's history id (its data is on that history). Local to this
    folder: no change record, like the identity keys themselves."""

    kind = "identity"
    session_id = ""

    def __init__(self, tables: Tables, history_id: str, start: int) -> None:
        self._tables = tables
        self._history_id = history_id
        self._start = start

    def size(self) -> int:
        return 0

    def touched(self) -> Sequence[str]:
        return ()

    def apply(self, txn: lmdb.Transaction, now_ns: int) -> changes.ApplyResult:
        put_history(txn, self._tables, self._history_id, self._start)
        return changes.ApplyResult(0, 0)


class LeadershipCommand:
    """Change the leadership record in the writer's transaction (see ``leadership``): ``change``
    maps the record read there to the new one, or raises a SessionLogError to refuse. With
    ``new_history`` (a promotion) the folder also starts a new history id and stops following;
    with ``follows`` it is recorded as a replica of that primary (a cluster member that follows).
    Local to this folder: no change record. ``outcome`` holds (before, after) once applied."""

    kind = "leadership"
    session_id = ""

    def __init__(
        self,
        tables: Tables,
        change: leadership.Change,
        new_history: bool = False,
        follows: str = "",
    ) -> None:
        self._tables = tables
        self._change = change
        self._new_history = new_history
        self._follows = follows
        self.outcome: tuple[leadership.Leadership, leadership.Leadership] | None = None

    def size(self) -> int:
        return 0

    def touched(self) -> Sequence[str]:
        return ()

    def apply(self, txn: lmdb.Transaction, now_ns: int) -> changes.ApplyResult:
        before = leadership.read(txn, self._tables)
        position = changes.head(txn, self._tables)[0]
        after = self._change(before, position + 1)
        if after != before:
            leadership.write(txn, self._tables, after)
        if self._new_history:
            put_history(txn, self._tables, new_history_id(), position)
            txn.delete(schema.FOLLOWS, db=self._tables.counters)
        elif self._follows:
            txn.put(schema.FOLLOWS, self._follows.encode(), db=self._tables.counters)
        self.outcome = (before, after)
        return changes.ApplyResult(0, 0)
