"""--durability group: a commit's replies wait until a later sync covers its meta page."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from sessionlog.defaults import GROUP, SYNC
from sessionlog.storage.store import AppendResult, Store, StoreConfig, prepare_append
from sessionlog.storage.writer import MAX_GROUP
from tests.integration.helpers import WriterGate, decoded, opened, read_all, user

WRITERS = 16
APPENDS_EACH = 40
WAIT_SECONDS = 30


@pytest.fixture
def grouped(tmp_path: Path) -> Iterator[Store]:
    with opened(tmp_path / "data", StoreConfig(durability=GROUP)) as store:
        yield store


def _watched(store: Store, future: Future[AppendResult], seen: list[tuple[int, int]]) -> None:
    """Record, when the future resolves (on the writer thread), the append's feed position
    beside the position the writer then knew to be synced."""

    def done(resolved: Future[AppendResult]) -> None:
        seen.append((resolved.result().position, store.writer.synced_position))

    future.add_done_callback(done)


def _hammer(
    store: Store, writer: int, seen: list[tuple[int, int]], failures: list[Exception]
) -> None:
    try:
        for i in range(APPENDS_EACH):
            future = store.submit_append(prepare_append(f"w{writer}", [user(f"{writer}:{i}")]))
            _watched(store, future, seen)
            assert future.result(WAIT_SECONDS).next_seq == i + 1
    except Exception as exc:  # reported by the test thread
        failures.append(exc)


def test_every_reply_comes_after_a_sync_covering_its_commit(grouped: Store) -> None:
    """16 threads of appends: each is answered only once the writer knows its commit synced,
    the logs are dense, and the load needs fewer explicit syncs than commits."""
    seen: list[tuple[int, int]] = []
    failures: list[Exception] = []
    threads = [
        threading.Thread(target=_hammer, args=(grouped, w, seen, failures)) for w in range(WRITERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_SECONDS)
    assert failures == []
    assert len(seen) == WRITERS * APPENDS_EACH
    assert all(0 < position <= synced for position, synced in seen)
    for w in range(WRITERS):
        assert [e.seq for e in decoded(read_all(grouped, f"w{w}"))] == list(range(APPENDS_EACH))
    stats = grouped.writer.stats
    assert stats.largest_group > 1
    assert stats.syncs < stats.commits  # the others were covered by the next group's commit


def test_a_lone_append_is_answered_after_one_explicit_sync(grouped: Store) -> None:
    """With nothing queued behind it, an append's commit is covered by one env.sync."""
    syncs = grouped.writer.stats.syncs
    seen: list[tuple[int, int]] = []
    future = grouped.submit_append(prepare_append("alone", [user("one")]))
    _watched(grouped, future, seen)
    assert future.result(WAIT_SECONDS).next_seq == 1
    assert grouped.writer.stats.syncs == syncs + 1
    assert seen == [(future.result().position, grouped.writer.synced_position)]


def test_the_next_groups_commit_covers_the_pending_one(grouped: Store) -> None:
    """Behind a held group, a full group (MAX_GROUP appends) and one more: the full group's
    commit is covered by the next one's data sync, the last by one env.sync."""
    gate = WriterGate()
    held = grouped.writer.submit(gate)
    assert gate.entered.wait(WAIT_SECONDS)
    commits, syncs = grouped.writer.stats.commits, grouped.writer.stats.syncs
    seen: list[tuple[int, int]] = []
    futures = []
    for i in range(MAX_GROUP + 1):
        futures.append(grouped.submit_append(prepare_append(f"q{i % 7}", [user(str(i))])))
        _watched(grouped, futures[-1], seen)
    gate.release.set()
    held.result(WAIT_SECONDS)
    assert [f.result(WAIT_SECONDS).next_seq for f in futures][:7] == [1] * 7
    assert grouped.writer.stats.commits == commits + 3  # the gate's, the full group's, the last
    assert grouped.writer.stats.syncs == syncs + 1
    assert len(seen) == MAX_GROUP + 1
    assert all(0 < position <= synced for position, synced in seen)


def test_sync_mode_answers_without_explicit_syncs(tmp_path: Path) -> None:
    """--durability sync keeps LMDB's two syncs per commit: the writer never syncs itself."""
    with opened(tmp_path / "data", StoreConfig(durability=SYNC)) as store:
        for i in range(5):
            store.append("s", [user(str(i))])
        assert store.writer.stats.syncs == 0
        last = store.append("s", [user("x")])
        assert store.writer.synced_position == last.position


def test_acknowledged_appends_survive_reopen(tmp_path: Path) -> None:
    """What group mode acknowledged is read back after close and reopen (also in sync mode)."""
    acknowledged: list[bytes] = []
    with opened(tmp_path / "data", StoreConfig(durability=GROUP)) as store:
        for i in range(10):
            acknowledged += store.append("s", [user(f"u{i}"), user(f"v{i}")]).events
    with opened(tmp_path / "data", StoreConfig(durability=SYNC)) as store:
        assert read_all(store, "s") == acknowledged


def test_a_cancelled_append_left_in_the_queue_does_not_hold_replies(grouped: Store) -> None:
    """A full group committed while only a cancelled append is queued behind it: the writer,
    finding nothing to take, syncs and answers the group before it waits for more."""
    gate = WriterGate()
    held = grouped.writer.submit(gate)
    assert gate.entered.wait(WAIT_SECONDS)
    futures = [
        grouped.submit_append(prepare_append(f"c{i % 5}", [user(str(i))])) for i in range(MAX_GROUP)
    ]
    given_up = grouped.submit_append(prepare_append("c-gone", [user("never")]))
    assert given_up.cancel()
    gate.release.set()
    held.result(WAIT_SECONDS)
    assert [f.result(WAIT_SECONDS).next_seq for f in futures][-1] == MAX_GROUP // 5 + 1
    assert grouped.meta("c-gone") is None
