"""Opening a data folder: its lock, its checks, the LMDB environment and the folder's identity.

The order is the invariant: the folder's lock first (FolderInUse when another server holds it),
then the checks that refuse a folder that lost its data or is damaged, then LMDB, then the
history (``identity.reconcile``, or only a read of it when the lock's owner has reconciled
already), then the change feed's index of a store from before it (``feed_index.catch_up``).
Whatever fails closes what was opened before it, and gives up a lock taken here.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import lmdb

from sessionlog.defaults import NOSYNC, SYNC
from sessionlog.storage import compaction, feed_index, folder, identity, integrity, schema
from sessionlog.storage.tables import Tables

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Opened:
    """An open folder: its lock, environment, named databases and identity."""

    lock: folder.FolderLock
    env: lmdb.Environment
    tables: Tables
    identity: identity.Identity


def open_folder(
    path: Path,
    *,
    lock: folder.FolderLock | None,
    map_size: int,
    durability: str,
    replica_of: str,
    elected: bool,
    prepared: bool,
) -> Opened:
    """Open the folder at ``path`` under ``lock`` (taken by a parent process, which keeps it),
    or under one taken here. ``prepared``: the lock's owner has opened this folder since taking
    the lock (checked it and reconciled its history), so only the identity is read here;
    otherwise ``replica_of`` and ``elected`` are what ``identity.reconcile`` records. A folder
    that has lost its data raises FolderDamaged; a full disk, FolderUnwritable."""
    held = folder.acquire(path) if lock is None else lock
    try:
        marker = folder.read_marker(path)
        folder.check_not_emptied(path, marker)
        if not prepared:
            integrity.refuse_damaged(path)
            _swap_compacted(path)
        env = lmdb.open(
            str(path),
            map_size=map_size,
            max_dbs=len(schema.ALL_DBS),
            # group: a commit syncs its data pages but not its meta page, which the writer
            # has synced (by the next commit, or env.sync) before it acknowledges the commit.
            sync=durability != NOSYNC,
            metasync=durability == SYNC,
            readahead=False,
            max_readers=1024,
        )
        try:
            tables = Tables(env)
            if prepared:
                # Reader slots left by a process of this server that died mid-read would
                # keep old pages from being reused: clear them (LMDB checks their PIDs).
                env.reader_check()
                found = _identity(env, tables)
            else:
                found = _writing(
                    path,
                    lambda: identity.reconcile(env, tables, path, marker, replica_of, elected),
                )
                _writing(path, lambda: feed_index.catch_up(env, tables))
        except BaseException:
            env.close()
            raise
    except BaseException:
        if lock is None:
            held.release()
        raise
    return Opened(held, env, tables, found)


def _swap_compacted(path: Path) -> None:
    """Swap in a copy ``admin compact --online`` left (``compaction.swap_pending``), and say so."""
    had = (path / compaction.PENDING / folder.DATA_FILE).is_file()
    try:
        done = compaction.swap_pending(path)
    except compaction.CopyInProgress:
        log.warning(
            "an admin compact --online is copying this folder: its copy waits for the next start"
        )
        return
    if done is not None:
        log.warning(
            "swapped in the compacted copy taken online, brought up to date",
            extra={
                "records_applied": done.records,
                "bytes_before": done.bytes_before,
                "bytes_after": done.bytes_after,
            },
        )
    elif had:
        log.warning(
            "removed a compacted copy taken online: not whole as written,"
            " or not of this folder's history"
        )


def _identity(env: lmdb.Environment, tables: Tables) -> identity.Identity:
    """The identity a prepared folder already has: read, never written."""
    with env.begin() as txn:
        history_id, start = identity.read(txn, tables)
    return identity.Identity(history_id, start, identity.OPENED)


def _writing(path: Path, write: Callable[[], T]) -> T:
    """``write`` (the history's reconciling, the feed index's catch-up: each writes the store),
    with a full disk turned into one line that says what to do."""
    try:
        return write()
    except (OSError, lmdb.Error) as exc:
        if not _disk_full(exc):
            raise
        raise folder.FolderUnwritable(
            f"cannot start on {str(path)!r}: the disk holding it is full ({exc}); free space "
            "there and start again (nothing was changed)"
        ) from None


def _disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(exc, lmdb.DiskError) or "No space left on device" in str(exc)
