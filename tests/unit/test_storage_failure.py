"""How the writer classifies a failed write transaction: by the OS error py-lmdb reports, with the
free space telling LMDB's short write on a full disk (EIO) from a disk that failed."""

from __future__ import annotations

import errno
import os

import lmdb
import pytest

from sessionlog import errors
from sessionlog.service.errors import status_code
from sessionlog.storage.writer import LOW_DISK_BYTES, storage_failure

PLENTY = 10 << 30
EIO_TEXT = f"mdb_txn_commit: {os.strerror(errno.EIO)}"


def test_a_full_map_is_storage_full_with_cause_map() -> None:
    """MDB_MAP_FULL: STORAGE_FULL, cause map, and the advice to raise --map-size."""
    failure = storage_failure(lmdb.MapFullError("mdb_put: MDB_MAP_FULL"), PLENTY, 100)
    assert failure is not None
    error = failure.error()
    assert (type(error), error.metadata) == (errors.StorageFull, {"cause": "map"})
    assert "--map-size" in error.message
    assert failure.retry_alone


@pytest.mark.parametrize("free", [0, PLENTY])
def test_enospc_is_a_full_disk_whatever_the_free_space_says(free: int) -> None:
    """ENOSPC (py-lmdb's DiskError): STORAGE_FULL, cause disk, refused as a group."""
    exc = lmdb.DiskError(f"mdb_txn_commit: {os.strerror(errno.ENOSPC)}")
    failure = storage_failure(exc, free, 100)
    assert failure is not None
    error = failure.error()
    assert (type(error), error.metadata) == (
        errors.StorageFull,
        {"cause": "disk", "errno": "ENOSPC"},
    )
    assert "writes resume by themselves" in error.message
    assert not failure.retry_alone


def test_eio_with_the_disk_out_of_room_is_a_full_disk() -> None:
    """EIO while less than the low-water mark is free: the short write of a full disk."""
    failure = storage_failure(lmdb.Error(EIO_TEXT), LOW_DISK_BYTES - 1, 100)
    assert failure is not None
    assert failure.error().metadata == {"cause": "disk", "errno": "EIO"}


def test_eio_with_room_left_is_a_storage_io_error() -> None:
    """EIO with space to spare: UNAVAILABLE / STORAGE_IO_ERROR, cause io, retry later."""
    failure = storage_failure(lmdb.Error(EIO_TEXT), PLENTY, 100)
    assert failure is not None
    error = failure.error()
    assert (type(error), error.metadata) == (errors.StorageIoError, {"cause": "io", "errno": "EIO"})
    assert status_code(error).name == "UNAVAILABLE"
    assert not failure.retry_alone


def test_a_panic_says_restart() -> None:
    """MDB_PANIC (a failed meta page write): STORAGE_IO_ERROR, cause panic, restart the server."""
    exc = lmdb.PanicError("mdb_txn_begin: MDB_PANIC: Update of meta page failed")
    failure = storage_failure(exc, PLENTY, 100)
    assert failure is not None
    error = failure.error()
    assert (type(error), error.metadata) == (errors.StorageIoError, {"cause": "panic"})
    assert "restart" in error.message


def test_errors_that_are_not_the_disks_are_left_to_the_caller() -> None:
    """A bug or a bad value (not an OS error): None, so the writer retries per command."""
    assert storage_failure(ValueError("boom"), 0, 100) is None
    assert storage_failure(lmdb.BadValsizeError("mdb_put: MDB_BAD_VALSIZE"), 0, 100) is None
    assert storage_failure(lmdb.Error("mdb_put: something odd"), 0, 100) is None


def test_each_caller_gets_its_own_error() -> None:
    """Errors carry tracebacks: a failure makes a fresh one per future."""
    failure = storage_failure(lmdb.Error(EIO_TEXT), 0, 100)
    assert failure is not None
    assert failure.error() is not failure.error()
