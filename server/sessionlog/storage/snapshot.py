"""Consistent copies of a store: what `admin backup` writes and AdminService.SaveSnapshot streams.

A copy is LMDB's compacting copy (``mdb_env_copy2`` with ``MDB_CP_COMPACT``) taken inside one
read transaction: it holds exactly the state committed when that transaction began, without the
free pages, while the writer goes on (readers never block it). Every session in it is a dense
prefix of the source's log with the same stored bytes, and its change feed ends at the position
that transaction saw.

The copy is then *stamped* (``identity.stamp_copy``): its instance token is one no folder has
held, so a folder it is restored into starts a new history id. Nothing else has a fresh copy
open when it is stamped, so it is opened without a lock file.

A snapshot for a remote client is written to a temporary folder beside the data folder (the same
filesystem, so there is room for a copy no larger than the source's used pages), streamed from
there and removed; ``TEMPORARY_PREFIX`` names such folders, for an operator cleaning up after a
crash.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import lmdb

from sessionlog import errors
from sessionlog.storage import identity, schema
from sessionlog.storage.tables import Tables
from sessionlog.storage.usage import Usage, usage

DATA_FILE = "data.mdb"
TEMPORARY_PREFIX = ".sessionlog-snapshot-"


def copy(env: lmdb.Environment, tables: Tables, dest: Path) -> Usage:
    """Write a stamped, compacted copy of ``env`` into the existing empty folder ``dest``.

    Returns the usage the copy's read transaction saw: its sessions, events and position are
    the copy's."""
    with env.begin() as txn:
        source = usage(env, tables, txn)
        env.copy(str(dest), compact=True, txn=txn)
    stamp(dest, source.map_size)
    return source


def stamp(path: Path, map_size: int) -> None:
    """Mark the store in folder ``path`` as no folder's own data file (see the module doc).
    Call only while no other process has it open."""
    env = lmdb.open(
        str(path), map_size=map_size, max_dbs=len(schema.ALL_DBS), lock=False, create=False
    )
    try:
        identity.stamp_copy(env, Tables(env))
    finally:
        env.close()


def temporary_folder(data: Path) -> Path:
    """A new empty folder for a snapshot of the store in ``data``: beside it when its parent is
    writable, else in the system's temporary directory."""
    parent = data.absolute().parent
    try:
        return Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX, dir=parent))
    except PermissionError:
        return Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX))


def discard(folder: Path) -> None:
    """Remove a temporary snapshot folder and what is in it (nothing when already gone)."""
    shutil.rmtree(folder, ignore_errors=True)


def failure(exc: lmdb.Error | OSError, where: Path) -> errors.SessionLogError:
    """The error a client gets when a copy into ``where`` failed: STORAGE_FULL for a full disk
    (cause ``disk``), STORAGE_IO_ERROR for anything else the disk or LMDB refused."""
    errno_code = getattr(exc, "errno", None) or _errno_of(exc)
    if errno_code in (errno.ENOSPC, errno.EDQUOT):
        return errors.StorageFull(
            f"no room on the disk for a snapshot in {str(where)!r}: free some space and retry",
            cause="disk",
        )
    return errors.StorageIoError(
        f"the snapshot into {str(where)!r} failed ({exc}); see the server log, then retry",
        cause="io",
    )


def _errno_of(exc: BaseException) -> int | None:
    """LMDB names an OS error only in its text (e.g. "No space left on device")."""
    text = str(exc)
    for code in (errno.ENOSPC, errno.EDQUOT):
        if os.strerror(code) in text:
            return code
    return None
