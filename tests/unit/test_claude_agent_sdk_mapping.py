"""sessionlog_client.claude_agent_sdk's pure part: transcript keys become valid session ids that
read back, long parts are hashed, request ids follow the uuids, and entries round trip exactly
in events the server accepts."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionlog.fold import check_event, check_session_id
from sessionlog.v1.event_pb2 import Event
from sessionlog_client.claude_agent_sdk import (
    SessionlogSessionStore,
    entries_of,
    entry_of,
    escape,
    event_of_entry,
    request_id_of,
    unescape,
)
from sessionlog_client.v1.event_pb2 import Event as ClientEvent
from sessionlog_client.v1.event_pb2 import EventType

STORE = SessionlogSessionStore("127.0.0.1:1")

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=20,
)


@given(st.text(max_size=300), st.text(min_size=1, max_size=60), st.text(min_size=1, max_size=200))
def test_keys_make_valid_ids_that_read_back(project: str, session: str, subpath: str) -> None:
    """Any project key, session id and subpath make ids the server accepts, the session id reads
    back from the main id, and the child id extends the main one; or ValueError, up front."""
    key: Any = {"project_key": project, "session_id": session}
    prefix = STORE._project_prefix(project)
    if len((prefix + escape(session)).encode()) > 235 - 65:
        with pytest.raises(ValueError, match="too long"):
            STORE.session_log_id(key)
        return
    main = STORE.session_log_id(key)
    child_key: Any = {**key, "subpath": subpath}
    child = STORE.session_log_id(child_key)
    for log_id in (main, child):
        check_session_id(log_id)
    assert main.startswith(prefix)
    assert "." not in main[len(prefix) :]
    assert unescape(main[len(prefix) :]) == session
    assert child.startswith(main + ".")


def test_a_long_project_key_is_hashed_and_a_long_session_id_refused() -> None:
    """A 200-character project key (the SDK's limit) is named by its hash; a session id past
    what fits is refused before anything is sent."""
    key: Any = {"project_key": "-" + "x" * 199, "session_id": "0b9e-4c1d"}
    assert STORE.session_log_id(key).startswith("claude._h")
    with pytest.raises(ValueError, match="too long"):
        STORE.session_log_id({"project_key": "p", "session_id": "s" * 200})


def test_request_ids_follow_the_uuids() -> None:
    """Equal uuids give equal request ids, other uuids others; no uuid, no request id."""
    a: Any = [{"type": "user", "uuid": "1"}, {"type": "x"}, {"type": "user", "uuid": "2"}]
    b: Any = [{"type": "user", "uuid": "1", "other": 1}, {"type": "user", "uuid": "2"}]
    assert request_id_of(a) == request_id_of(b) != request_id_of(a[:1])
    tag: Any = {"type": "tag", "tag": "t"}
    assert request_id_of([tag]) is None
    assert len(request_id_of(a) or "") <= 256


@given(st.dictionaries(st.text(max_size=8), _json, max_size=5), st.sampled_from(["user", "x"]))
def test_any_entry_round_trips_in_an_event_the_server_accepts(
    extra: dict[str, Any], kind: str
) -> None:
    """Whatever JSON an entry holds, the event passes the server's checks and reads back as it."""
    entry: Any = {**extra, "type": kind}
    made = event_of_entry(entry)
    assert check_event(Event.FromString(made.SerializeToString()), 0) is None
    assert entry_of(made) == entry


def test_entries_project_as_the_conversation() -> None:
    """User text, assistant text and tool use, tool results; anything else is bookkeeping."""
    user: Any = {"type": "user", "message": {"role": "user", "content": "hi"}}
    said: Any = {
        "type": "assistant",
        "message": {"content": [{"type": "text", "text": "a"}, {"type": "tool_use", "id": "t"}]},
    }
    result: Any = {
        "type": "user",
        "message": {"content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]},
    }
    assert event_of_entry(user).type == EventType.EVENT_TYPE_USER_MESSAGE
    assert event_of_entry(said).type == EventType.EVENT_TYPE_ASSISTANT_MESSAGE
    assert event_of_entry(result).type == EventType.EVENT_TYPE_TOOL_RESULT
    assert event_of_entry({"type": "summary"}).type == EventType.EVENT_TYPE_STEP_END


def test_entries_of_reads_a_batch_as_entry_of_reads_each_event() -> None:
    """A load's batch reading: the entries entry_of finds, in order, other events left out
    (a foreign message, an entry_json that is not an object, JSON with whitespace around)."""
    stored: list[Any] = [
        {"type": "user", "uuid": "a", "message": {"role": "user", "content": "hi"}},
        {"type": "x", "n": 1.0, "big": 2**60},
    ]
    foreign = ClientEvent(type=EventType.EVENT_TYPE_USER_MESSAGE)
    foreign.data.update({"content": "from elsewhere"})
    listed = ClientEvent(type=EventType.EVENT_TYPE_STEP_END)
    listed.data.update({"entry_json": "[1, 2]"})
    spaced = ClientEvent(type=EventType.EVENT_TYPE_STEP_END)
    spaced.data.update({"entry_json": ' {"type": "y"} '})
    batch = [event_of_entry(stored[0]), foreign, listed, event_of_entry(stored[1]), spaced]
    batch = [ClientEvent.FromString(e.SerializeToString()) for e in batch]
    found = entries_of(batch)
    assert found == [*stored, {"type": "y"}]
    assert found == [e for e in (entry_of(x) for x in batch) if e is not None]
    assert type(cast("dict[str, Any]", found[1])["n"]) is float
    assert entries_of([batch[0], batch[3]]) == stored  # a batch of entries alone
    assert entries_of([]) == []
