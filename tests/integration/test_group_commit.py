"""Concurrent appends share transactions (group commit) without losing order or isolation."""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import Future
from typing import Any

import pytest

from sessionlog import errors
from sessionlog.storage.store import AppendResult, Store, prepare_append
from sessionlog.v1.event_pb2 import Event
from tests.integration.helpers import WriterGate, decoded, read_all, user

WRITERS = 16
APPENDS_EACH = 50
WAIT_SECONDS = 30


def _hammer(store: Store, writer: int, failures: list[BaseException]) -> None:
    try:
        for i in range(APPENDS_EACH):
            own = store.append(f"own-{writer}", [user(f"{writer}:{i}")])
            assert own.next_seq == i + 1
            store.append("shared", [user(f"{writer}:{i}", writer=writer, i=i)])
    except BaseException as exc:  # reported by the test thread
        failures.append(exc)


def test_concurrent_writers_get_dense_seqs_and_share_commits(store: Store) -> None:
    """16 threads x 50 appends: all acknowledged, dense per session, fewer commits than appends."""
    failures: list[BaseException] = []
    threads = [threading.Thread(target=_hammer, args=(store, w, failures)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_SECONDS)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []

    total = WRITERS * APPENDS_EACH * 2
    for w in range(WRITERS):
        own = decoded(read_all(store, f"own-{w}"))
        assert [e.seq for e in own] == list(range(APPENDS_EACH))
        assert [e.data.fields["content"].string_value for e in own] == [
            f"{w}:{i}" for i in range(APPENDS_EACH)
        ]
    shared = decoded(read_all(store, "shared"))
    assert [e.seq for e in shared] == list(range(WRITERS * APPENDS_EACH))
    per_writer: dict[int, list[int]] = defaultdict(list)
    for e in shared:
        per_writer[int(e.data.fields["writer"].number_value)].append(
            int(e.data.fields["i"].number_value)
        )
    assert per_writer == {w: list(range(APPENDS_EACH)) for w in range(WRITERS)}

    stats = store.writer.stats
    assert stats.commands == total
    assert stats.commits < total
    assert stats.largest_group > 1


def test_queued_appends_commit_as_one_group(store: Store) -> None:
    """Appends queued while the writer is busy all land in a single transaction."""
    gate = WriterGate()
    held = store.writer.submit(gate)
    assert gate.entered.wait(WAIT_SECONDS)
    commits_before = store.writer.stats.commits
    futures = [store.submit_append(prepare_append(f"g{i % 3}", [user(str(i))])) for i in range(30)]
    gate.release.set()
    held.result(WAIT_SECONDS)
    results = [f.result(WAIT_SECONDS) for f in futures]
    assert store.writer.stats.commits == commits_before + 2
    assert store.writer.stats.largest_group >= 30
    assert [r.next_seq for r in results] == [i // 3 + 1 for i in range(30)]


def test_failure_inside_group_leaves_other_appends_intact(store: Store) -> None:
    """A SEQ_CONFLICT, a bad event and a reused request id fail alone; the group's rest commits."""
    store.append("s", [user("base")], request_id="r1")
    gate = WriterGate()
    held = store.writer.submit(gate)
    assert gate.entered.wait(WAIT_SECONDS)
    commits_before = store.writer.stats.commits

    def submit(session: str, events: list[Event], **options: Any) -> Future[AppendResult]:
        return store.submit_append(prepare_append(session, events, **options))

    ok_before = submit("s", [user("one")], expected_seq=1)
    conflict = submit("s", [user("lost")], expected_seq=1)
    ok_other = submit("t", [user("t0"), user("t1")])
    bad_event = submit("s", [user("x"), Event()])
    reused = submit("s", [user("different")], request_id="r1")
    ok_after = submit("s", [user("two")], expected_seq=2)
    gate.release.set()
    held.result(WAIT_SECONDS)

    assert ok_before.result(WAIT_SECONDS).next_seq == 2
    with pytest.raises(errors.SeqConflict) as caught:
        conflict.result(WAIT_SECONDS)
    assert caught.value.metadata["next_seq"] == "2"
    with pytest.raises(errors.UnknownEventType):
        bad_event.result(WAIT_SECONDS)
    with pytest.raises(errors.RequestIdReused):
        reused.result(WAIT_SECONDS)
    assert ok_other.result(WAIT_SECONDS).next_seq == 2
    assert ok_after.result(WAIT_SECONDS).next_seq == 3
    assert store.writer.stats.commits == commits_before + 2

    stored = decoded(read_all(store, "s"))
    assert [e.data.fields["content"].string_value for e in stored] == ["base", "one", "two"]
    assert [e.seq for e in stored] == [0, 1, 2]
    assert len(read_all(store, "t")) == 2
