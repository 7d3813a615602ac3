"""What an acknowledged append leaves on disk survives closing and reopening the store."""

from __future__ import annotations

from pathlib import Path

from sessionlog.v1.event_pb2 import Event
from tests.integration.helpers import (
    ASSISTANT,
    STEP_START,
    decoded,
    event,
    opened,
    read_all,
    replace,
    user,
)


def test_acknowledged_events_survive_reopen_byte_for_byte(tmp_path: Path) -> None:
    """Every acknowledged event is read back after reopen with the bytes Append returned."""
    acknowledged: list[bytes] = []
    with opened(tmp_path / "db") as store:
        for i in range(20):
            batch = [user(f"u{i}", n=i), event(ASSISTANT, content=f"a{i}", extra={"k": [i, True]})]
            acknowledged += store.append("s1", batch).events
    with opened(tmp_path / "db") as store:
        stored = read_all(store, "s1")
    assert stored == acknowledged
    assert [e.seq for e in decoded(stored)] == list(range(40))


def test_reopen_keeps_seq_time_and_data(tmp_path: Path) -> None:
    """After reopen each event has the seq, time (to the nanosecond) and data it was given."""
    sent = user("hello", nested={"list": [1, 2.5, None, "x"], "flag": False})
    sent.time.seconds = 1_700_000_000
    sent.time.nanos = 123_456_789
    with opened(tmp_path / "db") as store:
        store.append("s1", [event(STEP_START)])
        store.append("s1", [sent])
    with opened(tmp_path / "db") as store:
        back = decoded(read_all(store, "s1"))
    assert len(back) == 2
    assert back[1].seq == 1
    assert (back[1].time.seconds, back[1].time.nanos) == (1_700_000_000, 123_456_789)
    assert back[1].data == sent.data
    assert back[1].type == sent.type


def test_session_meta_survives_reopen(tmp_path: Path) -> None:
    """next_seq and replace_generation read the same after reopen as before close."""
    with opened(tmp_path / "db") as store:
        store.append("s1", [user("a"), user("b"), user("c")])
        store.append("s1", [replace("sum", 0, 1)])
        store.append("s1", [user("d"), replace("sum2", 0, 3)])
        before = store.meta("s1")
    assert before is not None
    assert (before.next_seq, before.replace_generation) == (6, 2)
    with opened(tmp_path / "db") as store:
        after = store.meta("s1")
    assert after == before


def test_appending_after_reopen_continues_densely(tmp_path: Path) -> None:
    """The first append after reopen gets the next seq; the log stays dense from 0."""
    with opened(tmp_path / "db") as store:
        first = store.append("s1", [user("a"), user("b")])
    assert first.next_seq == 2
    with opened(tmp_path / "db") as store:
        result = store.append("s1", [user("c")])
        assert result.next_seq == 3
        assert Event.FromString(result.events[0]).seq == 2
        store.append("s1", [user("d"), user("e")])
        seqs = [e.seq for e in decoded(read_all(store, "s1"))]
    assert seqs == list(range(5))


def test_sessions_created_after_reopen_get_fresh_logs(tmp_path: Path) -> None:
    """A session created after reopen starts at seq 0 and does not see another session's events."""
    with opened(tmp_path / "db") as store:
        store.append("old", [user("o1"), user("o2")])
    with opened(tmp_path / "db") as store:
        result = store.append("new", [user("n1")])
        assert Event.FromString(result.events[0]).seq == 0
        assert decoded(read_all(store, "new"))[0].data.fields["content"].string_value == "n1"
        assert len(read_all(store, "old")) == 2
        old_meta, new_meta = store.meta("old"), store.meta("new")
    assert old_meta is not None
    assert new_meta is not None
    assert old_meta.sid != new_meta.sid


def test_returned_bytes_are_the_stored_event(tmp_path: Path) -> None:
    """Append returns each event serialized exactly as SerializeToString of the stored event."""
    with opened(tmp_path / "db") as store:
        result = store.append("s1", [user("x"), event(STEP_START), user("y")])
        for raw in result.events:
            assert Event.FromString(raw).SerializeToString() == raw
        assert read_all(store, "s1") == result.events
