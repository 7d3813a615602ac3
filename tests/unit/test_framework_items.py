"""The framework backends' pure part (sessionlog_client._items): values kept exactly, and the
view of a log that hides apply to, bookkeeping events included, agreeing with the server's fold."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionlog.fold import SURFACE_TYPES, fold_surface
from sessionlog.fold import position as fold_position
from sessionlog.v1.event_pb2 import Event
from sessionlog_client._items import (
    get_exact,
    in_view,
    known_from,
    latest,
    loads,
    newest,
    position,
    put_exact,
    text_of,
)
from sessionlog_client.v1.event_pb2 import Event as ClientEvent
from tests.unit._events import HIDE, USER, ev
from tests.unit.test_fold_property import logs


def client_events(events: list[Event]) -> list[ClientEvent]:
    return [ClientEvent.FromString(e.SerializeToString()) for e in events]


@settings(max_examples=300, deadline=None)
@given(logs())
def test_in_view_shows_the_surface_the_fold_shows(events: list[Event]) -> None:
    """Restricted to surface events, the backends' view is the server's surface, in order."""
    shown = [e.seq for e in in_view(client_events(events)) if int(e.type) in SURFACE_TYPES]
    assert shown == [e.seq for e in fold_surface(events)]


@settings(max_examples=300, deadline=None)
@given(logs())
def test_in_view_hides_bookkeeping_events_by_the_same_rule(events: list[Event]) -> None:
    """A bookkeeping event is out of view exactly when a later replace or hide covers its seq."""
    ranges = [
        (e.seq, e.surface_op.replace.start_seq, e.surface_op.replace.stop_seq)
        for e in events
        if e.surface_op.HasField("replace")
    ]
    expected = [
        e.seq
        for e in events
        if not any(r > e.seq and a <= fold_position(e) <= b for r, a, b in ranges)
    ]
    assert sorted(e.seq for e in in_view(client_events(events))) == sorted(expected)


@settings(max_examples=300, deadline=None)
@given(logs(), st.integers(min_value=0, max_value=60))
def test_a_tail_decides_the_view_from_known_from_on(events: list[Event], cut: int) -> None:
    """The events from any seq on (what pages read from the end hold) show, from position
    ``known_from`` on, exactly what the whole log shows there; the whole log decides it all."""
    whole = client_events(events)
    tail = [e for e in whole if e.seq >= min(cut, len(whole) - 1)]  # a page holds one or more
    start = known_from(tail)
    assert start <= min((e.seq for e in tail), default=0)
    assert [e.seq for e in in_view(tail) if position(e) >= start] == [
        e.seq for e in in_view(whole) if position(e) >= start
    ]
    assert known_from(whole) == 0


def entries_by_type(event: ClientEvent) -> list[tuple[int, int]]:
    """What each event shows in the tests of ``newest``: none (bookkeeping), one, or two."""
    return [(event.seq, n) for n in range(int(event.type) % 3)]


@settings(max_examples=400, deadline=None)
@given(logs(), st.integers(min_value=0, max_value=60), st.integers(min_value=0, max_value=8))
def test_newest_is_the_end_of_the_whole_view_or_none(
    events: list[Event], cut: int, limit: int
) -> None:
    """From any tail, ``newest`` gives the latest ``limit`` entries of the whole log's view, or
    None only when it walked the whole tail with older events unread (``latest``, which the
    backends ask then, agrees wherever it answers)."""
    whole = client_events(events)
    every = [entry for e in in_view(whole) for entry in entries_by_type(e)]
    expected = every[-limit:] if limit > 0 else []
    newest_first = whole[::-1]
    for tail in (newest_first[: max(1, len(whole) - cut)], newest_first):
        more = len(tail) < len(whole)
        found = newest(tail, more, limit, entries_by_type)
        assert found is None or found == expected
        if found is None:
            assert more

        def shown(page: Any, start: int) -> list[tuple[int, int]]:
            return [x for e in in_view(page) if position(e) >= start for x in entries_by_type(e)]

        decided = latest(tail, more, limit, shown)
        assert decided is None or decided == expected


def test_newest_stops_at_the_newest_items_of_a_plain_log() -> None:
    """A log without replaces or hides: only the newest ``limit`` events are looked at."""
    log = client_events([ev(USER, {"content": str(n)}, seq=n) for n in range(10)])
    looked: list[int] = []

    def entries(event: ClientEvent) -> list[int]:
        looked.append(event.seq)
        return [event.seq]

    assert newest(log[::-1], True, 3, entries) == [7, 8, 9]
    assert looked == [9, 8, 7]


def test_a_hide_over_a_bookkeeping_event_takes_it_out_of_view() -> None:
    """user 0, step_end 1, hide(1, 1): the step_end is gone; the user message and the hide
    itself (which stores no item, so a backend passes over it) stay."""
    log = [ev(USER, {"content": "a"}, seq=0), ev(9, seq=1), ev(HIDE, seq=2, replace=(1, 1))]
    assert [e.seq for e in in_view(client_events(log))] == [0, 2]


def test_values_come_back_exactly() -> None:
    """Whole floats, big ints, key order and deep nesting survive put_exact / get_exact."""
    deep: object = 1
    for _ in range(30):
        deep = [deep]
    value = {"z": 1.0, "a": 2**60, "deep": deep}
    data: dict[str, Any] = {}
    put_exact(data, "item", value)
    made = ClientEvent()
    made.data.update(data)
    found, back = get_exact(ClientEvent.FromString(made.SerializeToString()), "item")
    assert found
    assert back == value
    assert list(back) == ["z", "a", "deep"]
    assert type(back["z"]) is float
    assert get_exact(made, "other") == (False, None)


def test_text_of_joins_the_text_parts() -> None:
    """A string is its own text; a list's named parts are joined; no text is None."""
    parts = {"input_text": "text", "refusal": "refusal"}
    assert text_of("hi", parts) == "hi"
    content = [
        {"type": "input_text", "text": "a"},
        {"type": "input_image", "image_url": "u"},
        {"type": "refusal", "refusal": "b"},
    ]
    assert text_of(content, parts) == "a\nb"
    assert text_of([{"type": "input_image"}], parts) is None
    assert text_of(None, parts) is None


@given(st.text(max_size=40))
def test_loads_agrees_with_json_loads(text: str) -> None:
    """Any text: the same value, or the same error, as json.loads."""
    try:
        expected: Any = json.loads(text)
    except json.JSONDecodeError as error:
        expected = error.msg
    try:
        got: Any = loads(text)
    except json.JSONDecodeError as error:
        got = error.msg
    assert got == expected or (got != got and expected != expected)  # NaN is not itself


def test_loads_reads_what_json_dumps_wrote_and_what_it_did_not() -> None:
    """Written JSON, JSON with whitespace around or inside, and non-JSON."""
    value = {"role": "user", "content": "hé \u2028", "n": [1, 2.5, None, True]}
    assert loads(json.dumps(value, ensure_ascii=False)) == value
    assert loads(' \n{"a": [1, 2]}\t') == {"a": [1, 2]}
    for bad in ("", "{", '{"a":1} x', "1,2", "[1] [2]"):
        with pytest.raises(json.JSONDecodeError):
            loads(bad)
