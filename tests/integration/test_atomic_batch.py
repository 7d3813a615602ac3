"""A batch append is all or nothing; lenient appends drop and report; times are kept exactly."""

from __future__ import annotations

import time

import pytest

from sessionlog import errors
from sessionlog.storage.store import Store
from sessionlog.v1.event_pb2 import Event
from tests.integration.helpers import contents, decoded, invalid, read_all, replace, user


def test_strict_batch_with_one_invalid_event_writes_nothing(store: Store) -> None:
    """One bad event fails the whole strict batch: the log and its meta are unchanged."""
    store.append("s1", [user("a")])
    with pytest.raises(errors.UnknownEventType) as caught:
        store.append("s1", [user("b"), user("c"), invalid(), user("d")])
    assert caught.value.metadata["index"] == "2"
    assert contents(read_all(store, "s1")) == ["a"]
    meta = store.meta("s1")
    assert meta is not None
    assert meta.next_seq == 1


def test_failed_batch_consumes_no_seq(store: Store) -> None:
    """The append after a failed one gets the seq the failed one would have had."""
    store.append("s1", [user("a"), user("b")])
    with pytest.raises(errors.UnknownEventType):
        store.append("s1", [user("c"), invalid()])
    result = store.append("s1", [user("c")])
    assert Event.FromString(result.events[0]).seq == 2
    assert result.next_seq == 3


def test_failed_batch_on_new_session_creates_nothing(store: Store) -> None:
    """A refused first append leaves no session behind, and the next one starts at seq 0."""
    with pytest.raises(errors.UnknownEventType):
        store.append("fresh", [user("a"), invalid()])
    assert store.meta("fresh") is None
    result = store.append("fresh", [user("a")])
    assert Event.FromString(result.events[0]).seq == 0


def test_replace_pointing_at_future_fails_whole_batch(store: Store) -> None:
    """A replace whose start_seq is past its own seq refuses the batch (rule 3 needs the seq)."""
    store.append("s1", [user("a")])
    with pytest.raises(errors.InvalidSurfaceOp) as caught:
        store.append("s1", [user("b"), replace("sum", 3, 4)])
    assert caught.value.metadata["index"] == "1"
    assert contents(read_all(store, "s1")) == ["a"]


def test_lenient_batch_writes_valid_events_densely(store: Store) -> None:
    """A lenient append drops the bad events, writes the rest with dense seqs, reports drops."""
    store.append("s1", [user("a")])
    batch = [invalid(), user("b"), user("c"), invalid(), replace("sum", 2, 2), user("d")]
    result = store.append("s1", batch, lenient=True)
    assert [(index, reason) for index, reason, _ in result.drops] == [
        (0, "UNKNOWN_EVENT_TYPE"),
        (3, "UNKNOWN_EVENT_TYPE"),
    ]
    assert all(message for _, _, message in result.drops)
    written = decoded(result.events)
    assert [e.seq for e in written] == [1, 2, 3, 4]
    assert result.next_seq == 5
    assert read_all(store, "s1")[1:] == result.events


def test_lenient_drop_of_future_replace_frees_its_seq(store: Store) -> None:
    """A lenient replace refused for pointing at the future is dropped; later events move up."""
    result = store.append("s1", [user("a"), replace("x", 2, 2), user("b")], lenient=True)
    assert [(i, r) for i, r, _ in result.drops] == [(1, "INVALID_SURFACE_OP")]
    assert [e.seq for e in decoded(result.events)] == [0, 1]
    assert contents(read_all(store, "s1")) == ["a", "b"]


def test_lenient_batch_all_dropped_creates_no_session(store: Store) -> None:
    """A lenient append whose every event is dropped writes nothing and creates no session."""
    result = store.append("s1", [invalid(), invalid()], lenient=True)
    assert result.events == []
    assert result.next_seq == 0
    assert [i for i, _, _ in result.drops] == [0, 1]
    assert store.meta("s1") is None


def test_empty_append_on_new_session_creates_nothing(store: Store) -> None:
    """An append with no events returns next_seq 0 and leaves no session."""
    result = store.append("s1", [])
    assert (result.events, result.next_seq, result.drops) == ([], 0, [])
    assert store.meta("s1") is None


def test_empty_append_returns_current_next_seq(store: Store) -> None:
    """An empty append on an existing session writes nothing and reports its next seq."""
    store.append("s1", [user("a"), user("b")])
    before = store.meta("s1")
    result = store.append("s1", [])
    assert (result.events, result.next_seq) == ([], 2)
    assert store.meta("s1") == before
    assert len(read_all(store, "s1")) == 2


def test_empty_append_still_checks_expected_seq(store: Store) -> None:
    """An empty append with a wrong expected_seq fails SEQ_CONFLICT naming the next seq."""
    store.append("s1", [user("a"), user("b")])
    assert store.append("s1", [], expected_seq=2).next_seq == 2
    with pytest.raises(errors.SeqConflict) as caught:
        store.append("s1", [], expected_seq=1)
    assert caught.value.reason == "SEQ_CONFLICT"
    assert caught.value.metadata["next_seq"] == "2"
    with pytest.raises(errors.SeqConflict) as on_new:
        store.append("never", [], expected_seq=3)
    assert on_new.value.metadata["next_seq"] == "0"
    assert store.meta("never") is None


def test_expected_seq_match_appends(store: Store) -> None:
    """expected_seq equal to the next seq appends; 0 works for a new session."""
    assert store.append("s1", [user("a")], expected_seq=0).next_seq == 1
    result = store.append("s1", [user("b"), user("c")], expected_seq=1)
    assert [e.seq for e in decoded(result.events)] == [1, 2]


def test_expected_seq_mismatch_writes_nothing(store: Store) -> None:
    """expected_seq behind or ahead of the log fails with SEQ_CONFLICT and writes nothing."""
    store.append("s1", [user("a"), user("b")])
    for wrong in (0, 1, 3, 100):
        with pytest.raises(errors.SeqConflict) as caught:
            store.append("s1", [user("x")], expected_seq=wrong)
        assert caught.value.metadata["next_seq"] == "2"
        assert caught.value.metadata["expected_seq"] == str(wrong)
    assert contents(read_all(store, "s1")) == ["a", "b"]


def test_client_time_is_stored_exactly(store: Store) -> None:
    """A client-supplied time keeps its seconds and nanoseconds, including odd nanos."""
    times = [(0, 1), (1_600_000_000, 999_999_999), (1_700_000_001, 1), (-1_000, 500)]
    batch = []
    for seconds, nanos in times:
        sent = user("t")
        sent.time.seconds = seconds
        sent.time.nanos = nanos
        batch.append(sent)
    store.append("s1", batch)
    back = decoded(read_all(store, "s1"))
    assert [(e.time.seconds, e.time.nanos) for e in back] == times


def test_missing_time_is_stamped_with_now(store: Store) -> None:
    """An event without a time gets the server's now, between before and after the call."""
    before = time.time_ns()
    result = store.append("s1", [user("a"), user("b")])
    after = time.time_ns()
    for stored in decoded(result.events):
        assert stored.HasField("time")
        assert before <= stored.time.ToNanoseconds() <= after
