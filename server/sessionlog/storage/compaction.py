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

Offline: call it with the folder lock held and no environment of the folder open. The copy
holds the same records byte for byte (the folder's identity, its change feed and checksums
included), so the server starts on it as on the old one, and its replicas go on following it.
What it cannot reach: blocks the filesystem had given the old file (unlinked, not overwritten),
copies elsewhere (backups, snapshots, a set-aside store of a rejoin or resync).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import lmdb

from sessionlog.storage import folder, schema

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
    """Replace the data file of folder ``path`` by a logical copy of it (see the module doc)."""
    data = path / folder.DATA_FILE
    before = data.stat().st_size
    old = lmdb.open(
        str(path), map_size=0, max_dbs=len(schema.ALL_DBS), readonly=True, readahead=False
    )
    building = path / BUILDING
    try:
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir()
        new = lmdb.open(
            str(building),
            map_size=old.info()["map_size"],
            max_dbs=len(schema.ALL_DBS),
            meminit=True,
        )
        try:
            records = sum(_copy_table(old, new, name) for name in schema.ALL_DBS)
            new.sync(True)
        finally:
            new.close()
    finally:
        old.close()
    copied = building / folder.DATA_FILE
    _fsync(copied)
    os.replace(copied, data)
    shutil.rmtree(building, ignore_errors=True)
    folder.fsync_dir(path)
    return Compacted(records, before, data.stat().st_size)


def _copy_table(old: lmdb.Environment, new: lmdb.Environment, name: bytes) -> int:
    """Copy one named table in key order, ``TXN_RECORDS`` per transaction; a table the old
    store never made (one newer than it) is made empty."""
    target = new.open_db(name)
    try:
        source = old.open_db(name, create=False)
    except (lmdb.NotFoundError, lmdb.ReadonlyError):  # not in the old store: none to copy
        return 0
    copied = 0
    after: bytes | None = None
    while True:
        with old.begin(db=source) as reading, new.begin(write=True, db=target) as writing:
            cursor = reading.cursor()
            found = cursor.set_range(after) if after is not None else cursor.first()
            if found and after is not None and cursor.key() == after:
                found = cursor.next()
            batch = 0
            while found and batch < TXN_RECORDS:
                key, value = cursor.item()
                writing.put(key, value, append=True)
                after = key
                batch += 1
                found = cursor.next()
        copied += batch
        if not found:
            return copied


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
