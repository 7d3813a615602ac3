"""The memoized state (kept with the surface memo) always equals a fresh fold of the stored log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from sessionlog import fold
from sessionlog.storage.store import Store, StoreConfig
from sessionlog.v1.event_pb2 import Event
from tests.integration.helpers import STEP_START, decoded, event, opened, read_all, replace, user


def with_delta(made: Event, changes: dict[str, Any]) -> Event:
    made.state_delta.update(changes)
    return made


def fresh(store: Store, session_id: str) -> dict[str, Any]:
    return MessageToDict(fold.fold_state(decoded(read_all(store, session_id))))


def read(store: Store, session_id: str, at_seq: int | None = None) -> dict[str, Any]:
    return MessageToDict(store.state(session_id, at_seq)[0])


STEPS: list[list[Event]] = [
    [with_delta(user("a"), {"a": 1, "b": {"x": 1}})],
    [with_delta(event(STEP_START), {"b": {"y": 2}}), user("plain")],
    [with_delta(replace("sum", 0, 2), {"a": None, "c": [1, 2]})],
    [with_delta(user("d"), {"a": "again"})],
]


def test_memo_equals_fresh_fold_after_each_append_and_prefix_read(store: Store) -> None:
    """After each append (and a prefix read in between) the state equals fold_state."""
    for batch in STEPS:
        store.append("s", batch)
        assert read(store, "s") == fresh(store, "s")
        assert read(store, "s", 0) == {"a": 1, "b": {"x": 1}}
    assert read(store, "s") == {"a": "again", "b": {"y": 2}, "c": [1, 2]}
    assert store.state("s")[1] == 5
    assert read(store, "s", 2) == {"a": 1, "b": {"y": 2}}


def test_a_returned_state_does_not_change_with_later_appends(store: Store) -> None:
    """The Struct handed out is a copy: appending afterwards leaves it as it was."""
    store.append("s", STEPS[0])
    before, count = store.state("s")
    store.append("s", [with_delta(user("z"), {"a": 99, "new": True})])
    assert MessageToDict(before) == {"a": 1, "b": {"x": 1}}
    assert count == 1


def test_state_survives_eviction_and_reopening(tmp_path: Path) -> None:
    """A tiny fold cache evicts sessions; their state is folded again from LMDB, the same."""
    config = StoreConfig(fold_cache_sessions=1)
    with opened(tmp_path / "d", config) as small:
        for i in range(3):
            small.append(f"s{i}", [with_delta(user("x"), {"i": i})])
        assert [read(small, f"s{i}") for i in range(3)] == [{"i": 0}, {"i": 1}, {"i": 2}]
    with opened(tmp_path / "d", config) as again:
        assert read(again, "s1") == {"i": 1}
