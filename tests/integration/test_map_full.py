"""A full LMDB map refuses writes cleanly, keeps reads working, and recovers with a larger map."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from sessionlog import errors, fold
from sessionlog.storage.store import Store, StoreConfig, prepare_append
from sessionlog.v1.event_pb2 import Event
from tests.integration.helpers import WriterGate, decoded, opened, read_all, replace, sid_of, user

SMALL_MAP = 1 << 20
LARGER_MAP = 8 << 20
MAX_FILL_APPENDS = 500
WAIT_SECONDS = 30


def _batch(i: int, size: int = 8000) -> list[Event]:
    return [user(f"{i}a", pad="x" * size), user(f"{i}b", pad="y" * size)]


def _fill(store: Store, session_id: str) -> tuple[list[bytes], errors.StorageFull]:
    """Append two-event batches until the map is full; return what was acknowledged."""
    acknowledged: list[bytes] = []
    for i in range(MAX_FILL_APPENDS):
        try:
            acknowledged += store.append(session_id, _batch(i)).events
        except errors.StorageFull as full:
            return acknowledged, full
    pytest.fail(f"{MAX_FILL_APPENDS} appends never filled a {SMALL_MAP}-byte map")


def _assert_readable(store: Store, session_id: str, acknowledged: list[bytes]) -> None:
    stored = read_all(store, session_id)
    assert stored == acknowledged
    meta = store.meta(session_id)
    assert meta is not None
    assert meta.next_seq == len(acknowledged)
    expected = fold.fold_surface(decoded(stored))
    assert store.surface(session_id).surface == expected


def test_filling_the_map_raises_storage_full_and_writes_nothing_partial(tmp_path: Path) -> None:
    """The append that overflows fails STORAGE_FULL; every earlier event is intact and readable."""
    with opened(tmp_path / "db", StoreConfig(map_size=SMALL_MAP)) as store:
        acknowledged, full = _fill(store, "s")
        assert full.reason == "STORAGE_FULL"
        assert len(acknowledged) >= 20
        assert [e.seq for e in decoded(acknowledged)] == list(range(len(acknowledged)))
        _assert_readable(store, "s", acknowledged)
        assert store.read_events(sid_of(store, "s"), len(acknowledged)) == []


def test_after_storage_full_small_appends_fit_or_fail_cleanly(tmp_path: Path) -> None:
    """After the map fills, small appends either land densely or fail cleanly; reads keep going."""
    with opened(tmp_path / "db", StoreConfig(map_size=SMALL_MAP)) as store:
        acknowledged, _ = _fill(store, "s")
        for i in range(20):
            with contextlib.suppress(errors.StorageFull):
                acknowledged += store.append("s", [user(f"small{i}")]).events
            _assert_readable(store, "s", acknowledged)
        with pytest.raises(errors.StorageFull):
            store.append("other", [user("big", pad="z" * 300_000)])
        assert store.meta("other") is None
        _assert_readable(store, "s", acknowledged)


def test_replace_refused_by_full_map_leaves_generation_unchanged(tmp_path: Path) -> None:
    """A replace that does not fit changes neither replace_generation nor the surface."""
    with opened(tmp_path / "db", StoreConfig(map_size=SMALL_MAP)) as store:
        acknowledged, _ = _fill(store, "s")
        before = store.meta("s")
        big_summary = replace("summary", 0, 3)
        big_summary.data.update({"pad": "q" * 300_000})
        with pytest.raises(errors.StorageFull):
            store.append("s", [big_summary])
        assert store.meta("s") == before
        _assert_readable(store, "s", acknowledged)


def test_reopen_with_larger_map_continues_with_next_seq(tmp_path: Path) -> None:
    """Reopening a full store with a larger map_size lets appends continue densely."""
    with opened(tmp_path / "db", StoreConfig(map_size=SMALL_MAP)) as store:
        acknowledged, _ = _fill(store, "s")
    with opened(tmp_path / "db", StoreConfig(map_size=LARGER_MAP)) as store:
        _assert_readable(store, "s", acknowledged)
        result = store.append("s", _batch(999))
        assert [e.seq for e in decoded(result.events)] == [len(acknowledged), len(acknowledged) + 1]
        result = store.append("s", [user("big", pad="z" * 300_000)])
        assert result.next_seq == len(acknowledged) + 3
        stored = read_all(store, "s")
    assert [e.seq for e in decoded(stored)] == list(range(len(acknowledged) + 3))


def test_oversized_append_in_a_group_does_not_fail_its_neighbours(tmp_path: Path) -> None:
    """A group holding one append too big for the map: only that one fails STORAGE_FULL."""
    with opened(tmp_path / "db", StoreConfig(map_size=SMALL_MAP)) as store:
        store.append("s", [user("first")])
        gate = WriterGate()
        held = store.writer.submit(gate)
        assert gate.entered.wait(WAIT_SECONDS)
        too_big = [user("big1", pad="a" * 700_000), user("big2", pad="b" * 700_000)]
        futures = [
            store.submit_append(prepare_append("s", [user("before")])),
            store.submit_append(prepare_append("s", too_big)),
            store.submit_append(prepare_append("t", [user("t0")])),
            store.submit_append(prepare_append("s", [user("after")])),
        ]
        gate.release.set()
        held.result(WAIT_SECONDS)
        assert futures[0].result(WAIT_SECONDS).next_seq == 2
        with pytest.raises(errors.StorageFull):
            futures[1].result(WAIT_SECONDS)
        assert futures[2].result(WAIT_SECONDS).next_seq == 1
        assert futures[3].result(WAIT_SECONDS).next_seq == 3
        stored = decoded(read_all(store, "s"))
        assert [e.data.fields["content"].string_value for e in stored] == [
            "first",
            "before",
            "after",
        ]
        assert [e.seq for e in stored] == [0, 1, 2]
