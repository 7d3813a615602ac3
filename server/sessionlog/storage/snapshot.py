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
there and removed; ``TEMPORARY_PREFIX`` names such folders. Each holds a copy of the store until
its client has it all, so a server takes at most ``MAX_AT_ONCE`` at once, over all its processes
(a ``flock`` on one of the data folder's ``snapshot-slot-K.lock`` files per snapshot; past them,
TOO_MANY_SNAPSHOTS). A folder in use is ``flock``ed too, so that ``clear_stale``, at every start,
removes only what a killed server left behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import lmdb

from sessionlog import errors
from sessionlog.storage import identity, schema
from sessionlog.storage.tables import Tables
from sessionlog.storage.usage import Usage, usage

DATA_FILE = "data.mdb"
TEMPORARY_PREFIX = ".sessionlog-snapshot-"
MAX_AT_ONCE = 2
"""Snapshots a server takes at once (see the module docstring)."""
SLOT_FILE = "snapshot-slot-{}.lock"
STALE_AFTER_SECONDS = 60.0
"""How old an unlocked temporary folder must be before ``clear_stale`` removes it (a folder is
locked a moment after it is made)."""


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


@dataclass
class Temporary:
    """A temporary snapshot folder and the slot it holds, until ``discard``."""

    path: Path
    _locks: tuple[int, ...]

    def discard(self) -> None:
        """Remove the folder and what is in it, then free its slot (once; later calls do
        nothing)."""
        shutil.rmtree(self.path, ignore_errors=True)
        locks, self._locks = self._locks, ()
        for fd in locks:
            os.close(fd)


def temporary_folder(data: Path) -> Temporary:
    """A new empty folder for a snapshot of the store in ``data``, beside it when its parent is
    writable, else in the system's temporary directory; TooManySnapshots when ``MAX_AT_ONCE``
    snapshots of it are being taken."""
    slot = _take_slot(data)
    try:
        parent = data.absolute().parent
        try:
            path = Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX, dir=parent))
        except PermissionError:
            path = Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX))
        lock = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except BaseException:
        os.close(slot)
        raise
    fcntl.flock(lock, fcntl.LOCK_EX)  # a new folder: nobody else locks it
    return Temporary(path, (lock, slot))


def _take_slot(data: Path) -> int:
    for number in range(MAX_AT_ONCE):
        fd = os.open(data / SLOT_FILE.format(number), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return fd
    raise errors.TooManySnapshots(
        f"{MAX_AT_ONCE} snapshots of this server are being taken already (it takes at most "
        f"{MAX_AT_ONCE} at once: each is a copy of the store on disk until its client has it "
        "all); retry when one has finished",
        limit=str(MAX_AT_ONCE),
    )


def clear_stale(data: Path) -> list[Path]:
    """Remove the temporary snapshot folders a killed server left beside ``data`` (or in the
    system's temporary directory): those no process holds locked, older than
    ``STALE_AFTER_SECONDS``. The folders removed."""
    removed = []
    for parent in {data.absolute().parent, Path(tempfile.gettempdir())}:
        for folder in parent.glob(TEMPORARY_PREFIX + "*"):
            with contextlib.suppress(OSError):
                if time.time() - folder.lstat().st_mtime >= STALE_AFTER_SECONDS and _unheld(folder):
                    shutil.rmtree(folder)
                    removed.append(folder)
    return removed


def _unheld(folder: Path) -> bool:
    """Whether ``folder`` is a directory no process holds a lock on (the lock is not kept)."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


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
