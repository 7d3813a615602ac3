"""The data folder: one owner at a time, and a marker that remembers what the folder held.

    <data>/data.mdb          LMDB's data file (see ``schema``)
    <data>/lock.mdb          LMDB's reader table
    <data>/sessionlog.lock   the PID of the server that owns the folder, for the error a
                             second one gets (the lock itself is a flock on the folder)
    <data>/sessionlog.folder the marker: JSON {format, created, instance, previous_instance}
    <data>/snapshot-slot-K.lock  empty; a snapshot in progress holds a flock on one
                             (``snapshot.MAX_AT_ONCE`` of them)
    <data>/compact-pending/  an online copy waiting for the next start (``compaction``)
    <data>/compact-online.lock  empty; an online copy in progress holds a flock on it

**One owner.** Two servers writing one folder would each cache nothing that matters (positions
and seqs are read inside the write transaction), but they would still split followers and
wakeups between them, so a second server is refused: :func:`acquire` takes an exclusive
``flock`` on the folder itself without waiting (a lock file could be deleted under it). The
lock belongs to the open directory, not to the process: processes forked after it was taken
(the workers of one server) share it, and it is released when the last of them exits, however
it exits (a SIGKILL included), so a stale lock never needs clearing by hand.

**The marker** says the folder has held a store. A folder with a marker but an empty or missing
``data.mdb`` has lost its data (never "a new store"). The marker also carries the *instance* of
the data file: a random token written into the LMDB environment and into the marker at every
open. A ``data.mdb`` whose instance is not the marker's is not the file this folder last held: it
was restored from a backup (or copied in), and its history gets a new id (see ``identity``).
The marker is written before the environment (the previous instance is kept in it), so a crash
between the two writes is never mistaken for a restore.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

DATA_FILE = "data.mdb"
LOCK_FILE = "sessionlog.lock"
MARKER_FILE = "sessionlog.folder"
MARKER_FORMAT = 1


class FolderInUse(RuntimeError):
    """Another process owns the data folder; the message names the folder and its PID."""


class FolderUnwritable(RuntimeError):
    """The folder cannot be written at start (a full disk, say); the message says what to do."""


class FolderDamaged(RuntimeError):
    """The folder has lost its data (or its marker is unreadable); the message says what to do."""


@dataclass
class FolderLock:
    """The exclusive lock on a data folder, held while this object's file stays open."""

    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the last descriptor of the file drops the flock
            self.fd = -1


def acquire(folder: Path) -> FolderLock:
    """Take the folder's lock, or raise FolderInUse naming the holder's PID.

    The lock is on the folder itself (a directory can be flocked like a file): a lock on a file
    inside it would be lost to anyone who deletes that file, and a second server would then take
    a lock of its own on the new one. ``sessionlog.lock`` only records the holder's PID, for the
    message the next one gets."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        pid = _recorded_pid(folder)
        who = f"PID {pid}" if pid else "another process"
        raise FolderInUse(
            f"the data folder {str(folder)!r} is in use by another sessionlog server ({who}); "
            "stop it first, or give this one another --data"
        ) from None
    try:
        record = os.open(folder / LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC)
        try:
            os.write(record, f"{os.getpid()}\n".encode())
        finally:
            os.close(record)
    except OSError:  # the PID is only for messages; a full disk must not stop the lock
        pass
    return FolderLock(folder, fd)


def _recorded_pid(folder: Path) -> int:
    with contextlib.suppress(OSError, ValueError):
        return int((folder / LOCK_FILE).read_text()[:32].strip() or 0)
    return 0


@dataclass(frozen=True)
class Marker:
    """What the folder remembers about the store it holds."""

    created: str
    instance: str
    previous_instance: str = ""

    def knows(self, instance: str) -> bool:
        """Whether ``instance`` is the data file this folder last held (or the one before, when
        a crash fell between writing the marker and the environment)."""
        return bool(instance) and instance in (self.instance, self.previous_instance)


def read_marker(folder: Path) -> Marker | None:
    path = folder / MARKER_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        fields = json.loads(raw)
        return Marker(
            created=str(fields["created"]),
            instance=str(fields["instance"]),
            previous_instance=str(fields.get("previous_instance", "")),
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        raise FolderDamaged(
            f"{str(path)!r} is not a sessionlog folder marker; if this folder's data is intact, "
            "move the file away and start again"
        ) from None


def write_marker(folder: Path, marker: Marker) -> None:
    """Replace the marker atomically (write, fsync, rename, fsync the folder)."""
    body = {
        "format": MARKER_FORMAT,
        "created": marker.created,
        "instance": marker.instance,
        "previous_instance": marker.previous_instance,
    }
    path = folder / MARKER_FILE
    temporary = folder / (MARKER_FILE + ".tmp")
    try:
        with open(temporary, "wb") as out:
            out.write(json.dumps(body).encode() + b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
    fsync_dir(folder)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_instance() -> str:
    return secrets.token_hex(8)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def check_not_emptied(folder: Path, marker: Marker | None) -> None:
    """Refuse a folder whose marker says it has held a store but whose data file is gone or
    empty: that is lost data, which must never be served as a new, empty store."""
    if marker is None:
        return
    data = folder / DATA_FILE
    size = data.stat().st_size if data.exists() else -1
    if size > 0:
        return
    what = "is missing" if size < 0 else "is empty (0 bytes)"
    raise FolderDamaged(
        f"{str(data)!r} {what}, but this folder has held a sessionlog store since "
        f"{marker.created}: its data is lost or was moved. Restore it from a backup (sessionlog "
        "admin restore) or a replica; to start an empty store here on purpose, remove "
        f"{str(folder / MARKER_FILE)!r}"
    )


SET_ASIDE = (DATA_FILE, "lock.mdb", MARKER_FILE)


def set_aside(folder: Path, label: str) -> Path | None:
    """Move the folder's store (data file, reader table, marker) into a new subfolder named
    ``label-<UTC time>``, leaving the folder empty for a new store; None if it held none.
    Call with the folder lock held. Nothing is deleted: the operator removes the copy."""
    present = [name for name in SET_ASIDE if (folder / name).exists()]
    if DATA_FILE not in present and MARKER_FILE not in present:
        return None
    target = folder / f"{label}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    target.mkdir()
    for name in present:
        os.replace(folder / name, target / name)
    fsync_dir(target)
    fsync_dir(folder)
    return target


def install_data_file(folder: Path, source: Path) -> None:
    """Put a copy of ``source`` in place as the folder's data file, atomically (copied beside
    it, synced, renamed over it). Call with the folder lock held and no environment open."""
    temporary = folder / (DATA_FILE + ".restoring")
    with open(source, "rb") as src, open(temporary, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(temporary, folder / DATA_FILE)
    with contextlib.suppress(FileNotFoundError):
        os.remove(folder / "lock.mdb")  # the reader table of the old file: LMDB makes a new one
    fsync_dir(folder)
