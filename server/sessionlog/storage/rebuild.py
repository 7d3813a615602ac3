"""Rebuild a data folder's store from its own change feed, up to a position: a rejoin's cut.

Every change record holds every put its write made, verbatim, and names its events (see
``changes``): applying records 1..N in order into an empty store gives exactly the store as it
was when record N committed. That is how replicas apply them, and how a deposed primary drops
what it wrote after the point where its history and the new primary's part: the rebuild writes
records 1..N (and their events) into a new data file, checking each record's chained checksum
on the way, and keeps the folder-local keys (the instance, the history id; the leadership
record is the caller's to write, in ``finish``). The old data file is set aside, never deleted.

What the cut discards (records N+1.. to the head) is listed record by record: position, epoch,
kind, session, seqs and request ids, so that nothing is dropped silently.

Call with the folder lock held and no environment of the folder open elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lmdb

from sessionlog.storage import changes, damage, feed_index, folder, schema
from sessionlog.storage.reads import read_range
from sessionlog.storage.tables import Tables
from sessionlog.v1 import replication_service_pb2 as rpb

BUILDING = "rejoin-building"
"""The subfolder the new store is built in (removed once it is in place, or at the next try)."""
TXN_RECORDS = 2000
"""Records copied per write transaction of the new store."""
_KIND_NAMES = {number: name for name, number in changes.KIND_BY_NAME.items()}
_FOLDER_KEYS = (schema.INSTANCE, schema.HISTORY_ID, schema.HISTORY_START)
"""Counters that are not in the change feed but stay with the folder."""


class RebuildRefused(Exception):
    """The store cannot be rebuilt from its feed; the message says why and what to do."""


@dataclass
class Discarded:
    """One change record a rebuild left out."""

    position: int
    epoch: int
    kind: str
    session_id: str
    seqs: list[int]
    """The seqs of the events it wrote (first_seq .. first_seq + count - 1)."""
    request_ids: list[str]
    commit_time: str


@dataclass
class Rebuilt:
    kept_through: int
    """The newest position the rebuilt store holds."""
    discarded: list[Discarded] = field(default_factory=list)
    set_aside: str = ""
    """Where the old store went (a subfolder of the data folder)."""

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def rebuild_through(
    path: Path,
    last_kept: int,
    finish: Callable[[lmdb.Transaction, Tables], None],
    label: str = "rejoined",
) -> Rebuilt:
    """Replace the folder's store by one rebuilt from its change records 1..``last_kept``;
    ``finish`` writes the caller's folder-local keys into the new store (one transaction,
    the last). RebuildRefused when the feed cannot rebuild it (a gap, damage, a store from
    before the feed)."""
    marker = folder.read_marker(path)
    old = lmdb.open(
        str(path), map_size=0, max_dbs=len(schema.ALL_DBS), readonly=True, readahead=False
    )
    building = path / BUILDING
    try:
        old_tables = Tables(old)
        with old.begin() as txn:
            head = changes.head(txn, old_tables)[0]
            if not 0 <= last_kept <= head:
                raise RebuildRefused(f"position {last_kept} is past this store's head {head}")
            _check_feed_starts_at_one(txn, old_tables, head)
            discarded = [discarded_at(txn, old_tables, p) for p in range(last_kept + 1, head + 1)]
            local = {key: txn.get(key, db=old_tables.counters) for key in _FOLDER_KEYS}
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir()
        new = lmdb.open(str(building), map_size=old.info()["map_size"], max_dbs=len(schema.ALL_DBS))
        try:
            new_tables = Tables(new)
            _copy(old, old_tables, new, new_tables, last_kept)
            with new.begin(write=True) as txn:
                for key, value in local.items():
                    if value is not None:
                        txn.put(key, bytes(value), db=new_tables.counters)
                finish(txn, new_tables)
            new.sync(True)
        finally:
            new.close()
    finally:
        old.close()
    aside = folder.set_aside(path, label)
    (building / folder.DATA_FILE).replace(path / folder.DATA_FILE)
    instance = local[schema.INSTANCE]
    folder.write_marker(
        path,
        folder.Marker(
            created=marker.created if marker is not None else folder.now_iso(),
            instance="" if instance is None else bytes(instance).decode(),
        ),
    )
    shutil.rmtree(building, ignore_errors=True)
    folder.fsync_dir(path)
    return Rebuilt(last_kept, discarded, "" if aside is None else str(aside))


def _check_feed_starts_at_one(txn: lmdb.Transaction, tables: Tables, head: int) -> None:
    """A store whose feed does not hold every write (made before the feed existed) cannot be
    rebuilt from it."""
    count = txn.stat(tables.changes)["entries"]
    cursor = txn.cursor(db=tables.changes)
    first = schema.read_u64(cursor.key()) if cursor.first() else 0
    if count != head or (head and first != 1):
        raise RebuildRefused(
            "this store's change feed does not hold every write from position 1 on (a store "
            "from before the feed, or damaged): it cannot be rebuilt from it. Set it aside "
            "with `sessionlog replica resync` and let the replica copy its primary instead"
        )


def _copy(
    old: lmdb.Environment, old_tables: Tables, new: lmdb.Environment, new_tables: Tables, last: int
) -> None:
    """Apply records 1..last of ``old`` to ``new`` as a replica would, checking the chain."""
    check = changes.ChecksumChain()
    position = 1
    while position <= last:
        stop = min(last, position + TXN_RECORDS - 1)
        with old.begin() as source, new.begin(write=True) as target:
            for at in range(position, stop + 1):
                record = _record(source, old_tables, at)
                change = rpb.Change.FromString(record)
                events = _events(source, old_tables, change)
                problem = check(at, record, events)
                if problem is not None:
                    raise RebuildRefused(f"change-feed record {at}: {problem}")
                changes.apply_writes(target, new_tables, change)
                for offset, event in enumerate(events):
                    key = schema.event_key(change.internal_id, change.first_seq + offset)
                    target.put(key, event, db=new_tables.events)
                target.put(schema.u64(at), record, db=new_tables.changes)
                feed_index.note(target, new_tables, at, change.session_id)
            feed_index.advance(target, new_tables, position, stop)
        position = stop + 1


def _record(txn: lmdb.Transaction, tables: Tables, position: int) -> bytes:
    with damage.reading(f"change-feed record {position}", position=position):
        raw = txn.get(schema.u64(position), db=tables.changes)
    if raw is None:
        raise RebuildRefused(f"change-feed record {position} is missing: the feed has a gap")
    return bytes(raw)


def _events(txn: lmdb.Transaction, tables: Tables, change: rpb.Change) -> list[bytes]:
    if not change.event_count:
        return []
    stop = change.first_seq + change.event_count
    events = read_range(
        txn, tables, change.internal_id, change.first_seq, stop, session_id=change.session_id
    )
    if len(events) != change.event_count:
        raise damage.missing_events(change.session_id, change.first_seq + len(events), stop)
    return events


def discarded_at(txn: lmdb.Transaction, tables: Tables, position: int) -> Discarded:
    change = rpb.Change.FromString(_record(txn, tables, position))
    request_ids = [
        put.key[8:].decode("utf-8", "replace") for put in change.puts if put.table == "requests"
    ]
    committed = change.commit_time.ToNanoseconds()
    return Discarded(
        position=position,
        epoch=change.epoch,
        kind=_KIND_NAMES.get(change.kind, "unknown"),
        session_id=change.session_id,
        seqs=list(range(change.first_seq, change.first_seq + change.event_count)),
        request_ids=request_ids,
        commit_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(committed / 1e9)),
    )


def report_path(path: Path) -> Path:
    """Where a rejoin's report goes: a new JSON file in the data folder."""
    return path / f"rejoin-report-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"


def write_report(target: Path, report: dict[str, object]) -> None:
    """Write a rejoin's report as JSON (synced, then renamed into place)."""
    temporary = target.with_suffix(".json.part")
    with temporary.open("w") as out:
        json.dump(report, out, indent=2)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    temporary.replace(target)
    folder.fsync_dir(target.parent)


NOTE_SESSIONS = 10
"""Sessions named in a rejoin's short note; the report names them all."""


def describe(note: dict[str, Any]) -> str:
    """The note of a rejoin in one sentence, for the status detail and the log."""
    head = (
        f"rejoined {note['primary']} at {note['time']}, keeping positions 1..{note['kept_through']}"
    )
    if not note["discarded"]:
        return f"{head}; nothing was discarded"
    sessions = note["sessions"]
    named = ", ".join(sessions[:NOTE_SESSIONS])
    if len(sessions) > NOTE_SESSIONS:
        named += f" and {len(sessions) - NOTE_SESSIONS} more"
    return (
        f"{head}; discarded {note['discarded']} records the new primary never had (positions "
        f"{note['first_discarded']}..{note['last_discarded']}, {note['events']} events of "
        f"sessions {named or '(none: lease changes only)'}); every one is listed in "
        f"{note['report']} in the data folder"
    )


def read_note(txn: lmdb.Transaction, tables: Tables) -> str:
    """The folder's last rejoin, described; "" when it never rejoined."""
    raw = txn.get(schema.REJOINED, db=tables.counters)
    return "" if raw is None else describe(json.loads(bytes(raw)))
