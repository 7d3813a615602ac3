"""The leadership record: the folder's epoch, whether it may take writes, and its epoch history.

One value in the ``counters`` table (key ``leadership``, JSON text), beside the identity keys and
like them never in the change feed: it describes this folder, not the data.

    {"epoch": 3, "role": "primary", "primary": "", "history": [[1, 1], [3, 120]]}

- **epoch**: the highest leadership epoch this folder knows (0: none yet). A primary stamps it on
  every change record it writes (``Change.epoch``); a store's first write takes epoch 1, so a
  promotion takes at least 2.
- **role**: ``primary`` (takes writes), ``replica`` (applies its primary's records) or
  ``fenced`` (a former primary that learned of a newer epoch: it refuses writes for good, also
  after a restart, until ``replica rejoin`` makes it a replica).
- **primary**: where writes go when this folder does not take them (HOST:PORT; "" unknown).
- **history**: ``(epoch, first position)`` for every epoch whose records the folder holds, or
  that it began as a primary (then possibly with no record yet), oldest first.
- **turned_from** (only when set): on a replica that turned to ``primary`` by itself (its primary
  was deposed and named the new one), the --replica-of it was opened with. Started again with
  that same, now stale, --replica-of, it goes on following ``primary``; with any other, the
  operator chose: it follows that one (``identity``).

Invariants: the epoch never falls; history epochs strictly rise and their first positions never
fall; the record at position p carries the epoch of the last history entry starting at or
before p (0 before the first entry: records from before epochs). The record is read and
changed only inside write transactions, by the writer thread of the process that writes (or at
open and rejoin, with the folder lock held), so every worker of a server sees one truth.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import lmdb

from sessionlog import errors
from sessionlog.storage import schema
from sessionlog.storage.tables import Tables

PRIMARY, REPLICA, FENCED = "primary", "replica", "fenced"
ROLES = (PRIMARY, REPLICA, FENCED)
FIRST_EPOCH = 1
"""The epoch a store's first primary writes in (lazily, with its first write)."""

History = tuple[tuple[int, int], ...]
Change = Callable[["Leadership", int], "Leadership"]
"""What a leadership command does: (the record, the next feed position) -> the new record."""


@dataclass(frozen=True)
class Leadership:
    epoch: int = 0
    role: str = PRIMARY
    primary: str = ""
    history: History = ()
    turned_from: str = ""

    @property
    def may_write(self) -> bool:
        return self.role == PRIMARY

    @property
    def last_epoch(self) -> int:
        """The epoch of the newest history entry (0 when there is none)."""
        return self.history[-1][0] if self.history else 0

    def encode(self) -> bytes:
        fields = {
            "epoch": self.epoch,
            "role": self.role,
            "primary": self.primary,
            "history": [list(entry) for entry in self.history],
        }
        if self.turned_from:
            fields["turned_from"] = self.turned_from
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> Leadership:
        fields = json.loads(bytes(raw))
        if fields["role"] not in ROLES:
            raise ValueError(f"unknown role {fields['role']!r}")
        history = tuple((int(e), int(p)) for e, p in fields["history"])
        turned_from = str(fields.get("turned_from", ""))
        return cls(
            int(fields["epoch"]), fields["role"], str(fields["primary"]), history, turned_from
        )


def read(txn: lmdb.Transaction, tables: Tables) -> Leadership:
    """The folder's leadership record; a primary at epoch 0 when it has none yet. Read from
    the transaction every time; only the JSON of bytes seen last time is not parsed again
    (the writer reads the record once per commit, and it rarely changes)."""
    global _last_read
    raw = txn.get(schema.LEADERSHIP, db=tables.counters)
    if raw is None:
        return Leadership()
    raw = bytes(raw)
    seen, decoded = _last_read
    if raw != seen:
        decoded = Leadership.decode(raw)
        _last_read = (raw, decoded)
    return decoded


_last_read: tuple[bytes, Leadership] = (b"", Leadership())
"""The bytes ``read`` decoded last and their record (frozen: safe to share; one tuple,
swapped whole, so a thread never sees the bytes of one record with another)."""


def write(txn: lmdb.Transaction, tables: Tables, record: Leadership) -> None:
    txn.put(schema.LEADERSHIP, record.encode(), db=tables.counters)


def epoch_at(history: Sequence[tuple[int, int]], position: int) -> int:
    """The epoch of the record at ``position`` by ``history`` (0 before its first entry)."""
    epoch = 0
    for entry_epoch, first in history:
        if first > position:
            break
        epoch = entry_epoch
    return epoch


def stamped(record: Leadership, position: int) -> Leadership:
    """The record after a primary's write at ``position``: its first write takes epoch 1."""
    if record.epoch:
        return record
    return replace(record, epoch=FIRST_EPOCH, history=((FIRST_EPOCH, position),))


def observed(record: Leadership, epoch: int, position: int) -> Leadership:
    """The record after applying a received change of ``epoch`` at ``position``."""
    if epoch <= record.last_epoch:
        return record
    return replace(
        record, epoch=max(record.epoch, epoch), history=(*record.history, (epoch, position))
    )


def promoted(record: Leadership, next_position: int, epoch: int = 0) -> Leadership:
    """The record of a folder that starts taking writes at ``next_position`` in a new epoch:
    ``epoch``, or one above every epoch it knows (at least 2: 1 is the first primary's).
    StaleEpoch for an ``epoch`` that is not above every epoch it knows, or is the first
    primary's (a replica that has not yet received its primary's first record knows none)."""
    known = max(record.epoch, record.last_epoch, FIRST_EPOCH)
    if epoch and epoch <= known:
        raise errors.StaleEpoch(
            f"epoch {epoch} is not above epoch {known}, the highest this server knows: a "
            "promotion needs a newer epoch",
            epoch=epoch,
            known_epoch=known,
        )
    taken = epoch or max(known, FIRST_EPOCH) + 1
    return Leadership(taken, PRIMARY, "", (*record.history, (taken, next_position)))


def promotion(epoch: int = 0) -> Change:
    """The change of a promotion (``promoted``, to ``epoch`` or one above every epoch known);
    it refuses with AlreadyPrimary a folder that takes writes already."""

    def promote(record: Leadership, next_position: int) -> Leadership:
        if record.may_write:
            raise errors.AlreadyPrimary(
                f"this server already takes writes (epoch {record.epoch}): nothing to promote",
                epoch=record.epoch,
            )
        return promoted(record, next_position, epoch)

    return promote


def elected(record: Leadership, next_position: int, epoch: int) -> Leadership:
    """The record of a folder that an election made the leader of ``epoch`` (etcd hands each
    epoch to one leader): ``promoted``, but also from a folder that took writes in an older
    epoch (a member that led before), and from one that already knows ``epoch`` without having
    written in it (a reader that learned it from the new leader's followers fenced it there).
    Unchanged when it already leads at ``epoch``; StaleEpoch below what it knows."""
    if record.may_write and record.epoch == epoch:
        return record
    if epoch < record.epoch or epoch <= max(record.last_epoch, FIRST_EPOCH):
        raise errors.StaleEpoch(
            f"the election's epoch {epoch} is not above epoch "
            f"{max(record.epoch, record.last_epoch)} this folder knows: epochs must rise (was "
            "etcd's data replaced?)",
            epoch=epoch,
            known_epoch=max(record.epoch, record.last_epoch),
        )
    return Leadership(epoch, PRIMARY, "", (*record.history, (epoch, next_position)))


def following(record: Leadership, primary: str) -> Leadership:
    """The record of a folder that replicates ``primary`` (a group member that an election
    made a follower): it takes no writes, and names ``primary`` to writers."""
    return replace(record, role=REPLICA, primary=primary)


def fenced(record: Leadership, epoch: int, primary: str) -> Leadership:
    """The record after learning of ``epoch`` (with its primary, if known) from a fence or a
    feed reader: a primary stops taking writes; anyone else only records the epoch. Unchanged
    when ``epoch`` is not above the one known."""
    if epoch <= record.epoch:
        return record
    if record.role == PRIMARY:
        return replace(record, epoch=epoch, role=FENCED, primary=primary)
    return replace(record, epoch=epoch, primary=primary or record.primary)


def followed(record: Leadership, epoch: int, primary: str) -> Leadership:
    """The record of a replica that turns to ``primary``, the primary of ``epoch`` (its old
    primary was deposed and named it): writes refused here name it from now on, and so does a
    start with the --replica-of it was opened with (``turned_from``). A folder that takes writes
    is fenced instead (it would not follow anyone while it leads)."""
    if record.role == PRIMARY:
        return fenced(record, epoch, primary)
    turned_from = record.turned_from or (record.primary if record.primary != primary else "")
    return replace(record, epoch=max(record.epoch, epoch), primary=primary, turned_from=turned_from)


def not_primary(record: Leadership) -> errors.NotPrimary:
    """The refusal a write gets from a folder that may not take writes."""
    if record.role == FENCED:
        where = (
            f"primary {record.primary}" if record.primary else "a primary this server cannot name"
        )
        message = (
            f"this server was deposed: it learned of epoch {record.epoch} ({where}) and takes no "
            "writes; send writes to the current primary"
        )
    else:
        where = record.primary or "its primary"
        message = f"this server is a read replica of {where}; send writes there"
    return errors.NotPrimary(message, primary=record.primary, epoch=record.epoch)


def behind(record: Leadership, seen: int) -> errors.NotPrimary | None:
    """The refusal of a write from a caller that has seen epoch ``seen``, above this folder's:
    a newer primary exists, so this one was deposed without being told (None when ``seen`` is
    not above it). It changes nothing: a caller's word does not depose a folder (anyone who may
    write could send any epoch); a replica's, through the feed, does (``fenced``)."""
    if seen <= record.epoch:
        return None
    return errors.NotPrimary(
        f"this server is at epoch {record.epoch} but the caller has seen epoch {seen}: a newer "
        "primary exists and this one was deposed without being told. Nothing was written; send "
        "writes to the current primary",
        primary="",
        epoch=record.epoch,
    )


def divergence(
    mine: Sequence[tuple[int, int]], theirs: Sequence[tuple[int, int]], limit: int
) -> int:
    """The first position (at most ``limit``) whose epoch differs between two epoch histories:
    where two feeds may part. ``limit`` is one past the shorter feed's newest position: up to
    there, every record exists in both and carries the epoch its history says."""
    starts = sorted({first for _, first in (*mine, *theirs) if first <= limit})
    for position in starts:
        if epoch_at(mine, position) != epoch_at(theirs, position):
            return position
    return limit
