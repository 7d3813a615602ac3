"""A full disk under a real Store (LMDB on a small tmpfs): STORAGE_FULL with cause disk, the whole
group refused in one failed commit, nothing written, and writes resuming once space is freed."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionlog import errors
from sessionlog.storage.store import Store, StoreConfig, prepare_append
from tests._tmpfs import fill, small_tmpfs
from tests.integration.helpers import WriterGate, opened, read_all, user

TMPFS_BYTES = 4 << 20
FILLER_BYTES = 3 << 20
MAP_SIZE = 64 << 20
"""Far larger than the tmpfs: the disk fills first."""
MAX_APPENDS = 2_000
QUEUED = 20
WAIT_SECONDS = 30


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs with a 3 MiB filler file on it."""
    with small_tmpfs(tmp_path / "disk", TMPFS_BYTES) as mounted:
        fill(mounted / "filler", FILLER_BYTES)
        yield mounted


def _fill(store: Store) -> tuple[list[bytes], errors.StorageFull]:
    """Append small events until the disk refuses; what was acknowledged, and the refusal."""
    acknowledged: list[bytes] = []
    for i in range(MAX_APPENDS):
        try:
            acknowledged += store.append("s", [user(f"{i}", pad="x" * 4000)]).events
        except errors.StorageFull as full:
            return acknowledged, full
    pytest.fail(f"{MAX_APPENDS} appends never filled the disk")


def test_a_full_disk_refuses_a_whole_group_in_one_commit_and_recovers(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a full disk a queued group of appends all get STORAGE_FULL/disk from one failed commit
    (no retry per command), nothing of them is stored, and once space is freed the same store
    takes appends again; the episode is one warning when it starts and one when it ends."""
    caplog.set_level(logging.WARNING, logger="sessionlog.storage.writer")
    with opened(disk / "data", StoreConfig(map_size=MAP_SIZE)) as store:
        acknowledged, full = _fill(store)
        assert full.metadata["cause"] == "disk"
        assert "Free disk space" in full.message
        stats = store.writer.stats
        failed_before = stats.failed_commits
        refused_before = stats.write_errors[("STORAGE_FULL", "disk")]

        gate = WriterGate()
        held = store.writer.submit(gate)
        assert gate.entered.wait(WAIT_SECONDS)
        futures = [
            store.submit_append(prepare_append("s", [user(f"q{i}", pad="y" * 4000)]))
            for i in range(QUEUED)
        ]
        gate.release.set()
        held.result(WAIT_SECONDS)
        for future in futures:
            refusal = future.exception(WAIT_SECONDS)
            assert isinstance(refusal, errors.StorageFull), refusal
            assert refusal.metadata["cause"] == "disk"
        assert len({id(future.exception()) for future in futures}) == QUEUED  # one error each
        assert stats.failed_commits == failed_before + 1
        assert stats.write_errors[("STORAGE_FULL", "disk")] == refused_before + QUEUED
        assert read_all(store, "s") == acknowledged

        (disk / "filler").unlink()
        after = store.append("s", [user("after")])
        assert after.events[0] == read_all(store, "s")[-1]
        assert after.next_seq == len(acknowledged) + 1
    messages = [r.getMessage().split(":")[0] for r in caplog.records]
    assert messages == ["storage writes failing", "storage writes succeed again"]
    assert caplog.records[1].refused == QUEUED + 1  # type: ignore[attr-defined]


def test_a_short_write_on_a_full_disk_is_storage_full_too(disk: Path) -> None:
    """A commit larger than the space left makes LMDB write part of it and report EIO; with the
    disk out of room that is STORAGE_FULL/disk (errno EIO), and nothing of it is stored."""
    with opened(disk / "data", StoreConfig(map_size=MAP_SIZE)) as store:
        store.append("s", [user("first")])
        big = [user(f"big{i}", pad="z" * 200_000) for i in range(10)]  # 2 MB, 1 MiB left
        with pytest.raises(errors.StorageFull) as caught:
            store.append("s", big)
        assert caught.value.metadata == {"cause": "disk", "errno": errno.errorcode[errno.EIO]}
        assert len(read_all(store, "s")) == 1
        meta = store.meta("s")
        assert meta is not None
        assert meta.next_seq == 1
