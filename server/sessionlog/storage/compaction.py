"""Rewrite a data folder's data file so that erased bytes are gone from it (`admin compact`).

LMDB never overwrites a page in place: a write copies the page, and the old copy joins the free
list, bytes and all, until a later write reuses it. A page still in use may also keep a removed
record's bytes in its unused middle (LMDB moves the other records over it, or not, and never
clears the gap). So after DeleteSession or RedactEvents the erased text is still in
``data.mdb``, readable with ``strings`` (``tests/integration/test_compaction.py`` shows it).

LMDB's own compacting copy (``mdb_env_copy2``) leaves out free pages, but copies each page in use
as it is, its unused middle included: clean in the cases tried here, guaranteed by nothing. So
the cure here is a *logical* copy: every key and value of every named
table, in key order, into a new environment whose pages start zeroed (py-lmdb's ``meminit``),
written with appends only (no record is ever removed from a page of the copy). The copy then
replaces ``data.mdb`` with one rename; the old file is unlinked, never kept or set aside.

**Online** (``copy_online``, ``admin compact --online``): the same logical copy, taken beside a
running server from one read transaction (a consistent state; LMDB lets a reader run beside
the writer, which only keeps the pages that reader sees from being reused meanwhile), into
``compact-pending/``. The server never swaps files under its open environment: the swap is the
one step that waits for a restart. At its next start (``swap_pending``, the folder lock held,
before the environment opens) the server brings the copy up to date by applying the change
records written since the copy was taken, as a replica applies them (checksums checked; the
folder-local counters copied as they are), and renames it over ``data.mdb``. A copy that is not
a prefix of the folder's history (its newest record's fingerprint, which an erasure's rewrite
keeps, is not the folder's there: a restore or a rejoin came between) is removed, unused, and
so is one whose data file is not byte for byte what the copy wrote (``SEAL``: cut short, LMDB
would fault reading past its end and the server would die at every start; overwritten, it would
refuse to open or read wrong): the folder's own data file is the truth, the copy only a saving.

Offline: call ``compact`` with the folder lock held and no environment of the folder open. The copy
holds the same records byte for byte (the folder's identity, its change feed and checksums
included), so the server starts on it as on the old one, and its replicas go on following it.
What it cannot reach: blocks the filesystem had given the old file (unlinked, not overwritten),
copies elsewhere (backups, snapshots, a set-aside store of a rejoin or resync).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from sessionlog.storage import changes, feed_index, folder, schema
from sessionlog.storage.tables import Tables

BUILDING = "compact-building"
"""The subfolder the copy is written in (removed once it is in place, or at the next try)."""
TXN_RECORDS = 10_000
"""Records copied per write transaction of the copy."""


@dataclass
class Compacted:
    """What a compaction did: records copied, and the data file's size before and after."""

    records: int
    bytes_before: int
    bytes_after: int


def compact(path: Path) -> Compacted:
    """Replace the data file of folder ``path`` by a logical copy of it (see the module doc);
    a pending online copy is stale after it, and removed."""
    data = path / folder.DATA_FILE
    before = data.stat().st_size
    shutil.rmtree(path / PENDING, ignore_errors=True)
    building = path / BUILDING
    records = _copy_into(path, building)
    copied = building / folder.DATA_FILE
    _fsync(copied)
    os.replace(copied, data)
    shutil.rmtree(building, ignore_errors=True)
    folder.fsync_dir(path)
    return Compacted(records, before, data.stat().st_size)


PENDING = "compact-pending"
"""The subfolder an online copy waits in for the next start (``swap_pending``)."""
PARTIAL = "compact-pending.partial"
"""Where an online copy is written; renamed to ``PENDING`` once whole."""
SEAL = "copied.json"
"""Beside the copy's data file: its size and SHA-256 as written, checked before it is opened."""
_LOCAL_COUNTERS = (
    schema.INSTANCE,
    schema.HISTORY_ID,
    schema.HISTORY_START,
    schema.FOLLOWS,
    schema.LEADERSHIP,
    schema.REJOINED,
)
"""Counters that are not in the change feed: the swap copies them from the folder as they are."""


@dataclass
class Pending:
    """An online copy waiting for the next start: records copied, the position it holds, and
    the data file's size beside the copy's."""

    records: int
    position: int
    bytes_now: int
    bytes_copy: int


def copy_online(path: Path) -> Pending:
    """Write a logical copy of the folder's store, read in one transaction beside a running
    server, into ``PENDING`` (replacing one there); the server swaps it in at its next start."""
    with _one_copy_at_once(path):
        return _copy_online(path)


COPYING = "compact-online.lock"
"""Empty; an online copy in progress holds a flock on it: one copy of a folder at a time."""


class CopyInProgress(OSError):
    """An online copy of the folder is being written (its ``COPYING`` lock is held)."""


@contextmanager
def _one_copy_at_once(path: Path) -> Iterator[None]:
    """Refuse a second online copy of the folder while one runs, and a server start's swap:
    each writes or removes ``PARTIAL`` (the other's half-written copy, under it)."""
    fd = os.open(path / COPYING, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CopyInProgress(
                errno.EBUSY,
                "another `admin compact --online` is copying this folder; wait for it to end",
            ) from None
        yield
    finally:
        os.close(fd)


def _copy_online(path: Path) -> Pending:
    partial, pending = path / PARTIAL, path / PENDING
    records = _copy_into(path, partial)
    try:
        _fsync(partial / folder.DATA_FILE)
        _seal(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(pending, ignore_errors=True)
    os.replace(partial, pending)
    folder.fsync_dir(path)
    env = lmdb.open(str(pending), max_dbs=len(schema.ALL_DBS), readonly=True, lock=False)
    try:
        tables = Tables(env)
        with env.begin() as txn:
            position = changes.head(txn, tables)[0]
    finally:
        env.close()
    return Pending(
        records,
        position,
        (path / folder.DATA_FILE).stat().st_size,
        (pending / folder.DATA_FILE).stat().st_size,
    )


def swap_pending(path: Path) -> Compacted | None:
    """At start, with the folder lock held and no environment open: bring a pending online
    copy up to date from the folder's change feed and swap it in (None: there was none, or it
    was not of this history and was removed). See the module doc. While an online copy is
    being written (a server started meanwhile) nothing is touched: CopyInProgress."""
    if not (path / PARTIAL).exists() and not (path / PENDING).exists():
        return None
    with _one_copy_at_once(path):
        return _swap_pending(path)


def _swap_pending(path: Path) -> Compacted | None:
    shutil.rmtree(path / PARTIAL, ignore_errors=True)
    pending = path / PENDING
    if not (pending / folder.DATA_FILE).is_file() or not _sealed(pending):
        shutil.rmtree(pending, ignore_errors=True)
        return None
    data = path / folder.DATA_FILE
    before = data.stat().st_size
    # map_size=0: the folder's own map size. Not given, LMDB's 10 MiB default (raised to the
    # file's size) is what info() reports, and the copy's catch-up ran out of map with it.
    live = lmdb.open(
        str(path), map_size=0, max_dbs=len(schema.ALL_DBS), readonly=True, readahead=False
    )
    try:
        new = lmdb.open(str(pending), map_size=live.info()["map_size"], max_dbs=len(schema.ALL_DBS))
        try:
            applied = _catch_up(live, new)
            new.sync(True)
        finally:
            new.close()
    finally:
        live.close()
    if applied is None:
        shutil.rmtree(pending, ignore_errors=True)
        return None
    copied = pending / folder.DATA_FILE
    _fsync(copied)
    os.replace(copied, data)
    shutil.rmtree(pending, ignore_errors=True)
    folder.fsync_dir(path)
    return Compacted(applied, before, data.stat().st_size)


def _seal(copy: Path) -> None:
    """Write the ``SEAL`` of the copy's data file, synced."""
    seal = copy / SEAL
    seal.write_text(json.dumps(_fingerprint(copy / folder.DATA_FILE)))
    _fsync(seal)


def _sealed(copy: Path) -> bool:
    """Whether the copy's data file is the one its ``SEAL`` describes (no seal: not a whole copy).
    Once the catch-up writes to it, it is not: a start cut short there drops the copy."""
    try:
        seal = json.loads((copy / SEAL).read_text())
    except (OSError, ValueError):
        return False
    return bool(seal == _fingerprint(copy / folder.DATA_FILE))


def _fingerprint(data: Path) -> dict[str, object]:
    digest = hashlib.sha256()
    size = 0
    with data.open("rb") as reading:
        while block := reading.read(1 << 20):
            digest.update(block)
            size += len(block)
    return {"size": size, "sha256": digest.hexdigest()}


def _catch_up(live: lmdb.Environment, new: lmdb.Environment) -> int | None:
    """Apply to ``new`` the records ``live`` wrote after it, and copy the folder-local counters;
    how many records (None: ``new`` is not a prefix of ``live``'s history)."""
    live_tables, new_tables = Tables(live), Tables(new)
    with new.begin() as txn, live.begin() as reading:
        position = changes.head(txn, new_tables)[0]
        # Fingerprints, not bytes: an erasure after the copy rewrites the record in the folder
        # to its erased form, which keeps the checksum (the history is the same).
        ours = changes.fingerprint_at(txn, new_tables, position)
        theirs = changes.fingerprint_at(reading, live_tables, position)
        if position and (ours is None or theirs is None or ours != theirs):
            return None
    # A copy of a store from before the index: index its own records first, or the records
    # applied below would move the counter past them, unindexed (a delete would miss them).
    feed_index.catch_up(new, new_tables)
    applied = 0
    while True:
        with live.begin() as reading:
            raws = changes.read_changes(reading, live_tables, position + 1, CATCH_UP_BYTES)
        if not raws:
            break
        received = [changes.ReceivedChange.parse(raw) for raw in raws]
        with new.begin(write=True) as txn:
            changes.ApplyChangesCommand(new_tables, received).apply(txn, 0)
        position = received[-1].change.position
        applied += len(received)
    with live.begin() as reading, new.begin(write=True) as txn:
        for key in _LOCAL_COUNTERS:
            value = reading.get(key, db=live_tables.counters)
            if value is None:
                txn.delete(key, db=new_tables.counters)
            else:
                txn.put(key, bytes(value), db=new_tables.counters)
    return applied


CATCH_UP_BYTES = 64 << 20
"""Change records (events included) applied per transaction when a pending copy catches up."""


def _copy_into(path: Path, building: Path) -> int:
    """A logical copy of the store in ``path`` into the new folder ``building``, every table
    read in one read transaction (so it is consistent beside a running writer); records copied."""
    old = lmdb.open(
        str(path), map_size=0, max_dbs=len(schema.ALL_DBS), readonly=True, readahead=False
    )
    try:
        shutil.rmtree(building, ignore_errors=True)
        _make_room(path, (old.info()["last_pgno"] + 1) * old.stat()["psize"])
        building.mkdir()
        try:
            records = _copy_tables(old, building)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)  # half a copy only takes the disk
            raise
    finally:
        old.close()
    return records


ROOM_MARGIN = 1 << 20
"""Free bytes a copy needs beyond the store's pages in use (its lock file, LMDB's metadata)."""


def _make_room(path: Path, used: int) -> None:
    """Refuse a copy the disk has no room for: a copy that fills the disk fails half-written
    (on a tmpfs LMDB dies of SIGBUS, the half-written copy left), and the server beside it,
    whose writes need that space, is refused too."""
    free = shutil.disk_usage(path).free
    if free < used + ROOM_MARGIN:
        raise OSError(
            errno.ENOSPC,
            f"no room for the copy: it needs up to {used + ROOM_MARGIN:,} bytes free on the disk "
            f"of the data folder, which has {free:,}; free disk space there and try again",
        )


def _copy_tables(old: lmdb.Environment, building: Path) -> int:
    new = lmdb.open(
        str(building), map_size=old.info()["map_size"], max_dbs=len(schema.ALL_DBS), meminit=True
    )
    try:
        sources = {name: _source(old, name) for name in schema.ALL_DBS}
        with old.begin() as reading:
            records = sum(_copy_table(reading, sources[name], new, name) for name in schema.ALL_DBS)
        new.sync(True)
    finally:
        new.close()
    return records


def _source(old: lmdb.Environment, name: bytes) -> Any:
    """The old store's handle of a named table; None when it never made it (one newer than it)."""
    try:
        return old.open_db(name, create=False)
    except (lmdb.NotFoundError, lmdb.ReadonlyError):
        return None


def _copy_table(reading: lmdb.Transaction, source: Any, new: lmdb.Environment, name: bytes) -> int:
    """Copy one named table in key order, ``TXN_RECORDS`` per write transaction; a table the
    old store never made (``source`` None) is made empty."""
    target = new.open_db(name)
    if source is None:
        return 0
    copied = 0
    cursor = reading.cursor(db=source)
    found = cursor.first()
    while found:
        with new.begin(write=True, db=target) as writing:
            batch = 0
            while found and batch < TXN_RECORDS:
                key, value = cursor.item()
                writing.put(key, value, append=True)
                batch += 1
                found = cursor.next()
        copied += batch
    return copied


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
