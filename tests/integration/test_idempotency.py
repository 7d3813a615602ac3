"""A request_id makes an append safe to retry: replays return the original result, write nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sessionlog import errors
from sessionlog.storage.store import Store, StoreConfig
from tests.integration.helpers import contents, decoded, invalid, opened, read_all, user


def test_replay_returns_original_result_and_writes_nothing(store: Store) -> None:
    """Retrying a request_id returns the same events and next_seq; the log does not grow."""
    store.append("s", [user("zero")])
    first = store.append("s", [user("a"), user("b")], request_id="req-1")
    store.append("s", [user("later")])
    before = store.meta("s")
    again = store.append("s", [user("a"), user("b")], request_id="req-1")
    assert again.events == first.events
    assert again.next_seq == first.next_seq == 3
    assert store.meta("s") == before
    assert contents(read_all(store, "s")) == ["zero", "a", "b", "later"]


def test_replay_with_the_same_event_objects_replays(store: Store) -> None:
    """Retrying with the very same Event objects (no time set by the caller) is still a replay."""
    batch = [user("a"), user("b")]
    first = store.append("s", batch, request_id="req-1")
    again = store.append("s", batch, request_id="req-1")
    assert again.events == first.events
    assert len(read_all(store, "s")) == 2


def test_replay_is_checked_before_expected_seq(store: Store) -> None:
    """A retry whose expected_seq was right the first time replays instead of conflicting."""
    first = store.append("s", [user("a")], request_id="req-1", expected_seq=0)
    again = store.append("s", [user("a")], request_id="req-1", expected_seq=0)
    assert again.events == first.events
    assert again.next_seq == 1


def test_same_request_id_with_different_events_is_refused(store: Store) -> None:
    """Reusing a request_id with other events fails REQUEST_ID_REUSED and writes nothing."""
    store.append("s", [user("a")], request_id="req-1")
    for other in ([user("b")], [user("a"), user("a")], []):
        with pytest.raises(errors.RequestIdReused) as caught:
            store.append("s", other, request_id="req-1")
        assert caught.value.reason == "REQUEST_ID_REUSED"
    with pytest.raises(errors.RequestIdReused):
        store.append("s", [user("a")], request_id="req-1", lenient=True)
    assert contents(read_all(store, "s")) == ["a"]


def test_lenient_replay_returns_original_drops(store: Store) -> None:
    """A replayed lenient append reports the same drops as the original."""
    first = store.append("s", [user("a"), invalid(), user("b")], request_id="r", lenient=True)
    again = store.append("s", [user("a"), invalid(), user("b")], request_id="r", lenient=True)
    assert again.drops == first.drops
    assert [i for i, _, _ in again.drops] == [1]
    assert again.events == first.events
    assert len(read_all(store, "s")) == 2


def test_replay_survives_reopen(tmp_path: Path) -> None:
    """A request_id is still recognised after the store is closed and reopened."""
    with opened(tmp_path / "db") as store:
        first = store.append("s", [user("a"), user("b")], request_id="req-1")
    with opened(tmp_path / "db") as store:
        again = store.append("s", [user("a"), user("b")], request_id="req-1")
        with pytest.raises(errors.RequestIdReused):
            store.append("s", [user("c")], request_id="req-1")
        stored = read_all(store, "s")
    assert again.events == first.events
    assert again.next_seq == 2
    assert stored == first.events


def test_request_id_is_scoped_to_its_session(store: Store) -> None:
    """The same request_id on another session is a new append there, with different events too."""
    store.append("s", [user("a")], request_id="req-1")
    other = store.append("t", [user("x"), user("y")], request_id="req-1")
    assert [e.seq for e in decoded(other.events)] == [0, 1]
    assert contents(read_all(store, "t")) == ["x", "y"]
    assert contents(read_all(store, "s")) == ["a"]
    assert store.append("t", [user("x"), user("y")], request_id="req-1").events == other.events


def test_request_id_of_a_failed_append_is_not_remembered(store: Store) -> None:
    """An append refused with SEQ_CONFLICT does not claim its request_id."""
    store.append("s", [user("a")])
    with pytest.raises(errors.SeqConflict):
        store.append("s", [user("b")], request_id="req-1", expected_seq=5)
    result = store.append("s", [user("c")], request_id="req-1")
    assert contents(result.events) == ["c"]


def test_expired_request_id_is_treated_as_new(tmp_path: Path) -> None:
    """Past the request_id window a retry appends again, and other events are accepted."""
    config = StoreConfig(request_id_ttl_seconds=0)
    with opened(tmp_path / "db", config) as store:
        first = store.append("s", [user("a")], request_id="req-1")
        time.sleep(0.002)
        second = store.append("s", [user("a")], request_id="req-1")
        assert [e.seq for e in decoded(first.events)] == [0]
        assert [e.seq for e in decoded(second.events)] == [1]
        time.sleep(0.002)
        third = store.append("s", [user("other")], request_id="req-1")
        assert third.next_seq == 3
        assert contents(read_all(store, "s")) == ["a", "a", "other"]


def test_request_id_within_window_is_remembered(tmp_path: Path) -> None:
    """With a one-hour window an immediate retry replays and writes nothing."""
    with opened(tmp_path / "db", StoreConfig(request_id_ttl_seconds=3600)) as store:
        first = store.append("s", [user("a")], request_id="req-1")
        assert store.append("s", [user("a")], request_id="req-1").events == first.events
        meta = store.meta("s")
        assert meta is not None
        assert meta.next_seq == 1
