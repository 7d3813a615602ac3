"""sessionlog_client.google_adk's pure part: id parts escape reversibly into valid session ids,
and each kind of ADK event becomes the sessionlog event the derived view should show, keeping
the ADK event exactly."""

from __future__ import annotations

import json

import pytest
from google.adk.events.event import Event as AdkEvent
from google.adk.events.event_actions import EventActions
from google.genai import types
from hypothesis import given
from hypothesis import strategies as st

from sessionlog import errors
from sessionlog.fold import check_event, check_session_id
from sessionlog.v1.event_pb2 import Event
from sessionlog_client.convert import struct_to_dict
from sessionlog_client.google_adk import (
    SessionlogSessionService,
    adk_event_of,
    escape,
    event_of_adk,
    unescape,
)
from sessionlog_client.v1.event_pb2 import EventType

SERVICE = SessionlogSessionService("127.0.0.1:1")


@given(st.text(max_size=40), st.text(max_size=40), st.text(max_size=40))
def test_parts_escape_reversibly_into_a_valid_session_id(app: str, user: str, sid: str) -> None:
    """Any app, user and session id reads back as itself, holds no '.', and makes an id the
    server accepts (or a ValueError naming the limit, before anything is sent)."""
    for part in (app, user, sid):
        assert "." not in escape(part)
        assert unescape(escape(part)) == part
    made = "adk.s." + ".".join(escape(p) for p in (app, user, sid))
    if len(made.encode()) > 235:
        with pytest.raises(ValueError, match="235"):
            SERVICE.session_log_id(app, user, sid)
        return
    log_id = SERVICE.session_log_id(app, user, sid)
    check_session_id(log_id)
    rest = log_id.removeprefix("adk.s.")
    assert [unescape(p) for p in rest.split(".")] == [app, user, sid]


def test_a_known_id_escapes_as_documented() -> None:
    """'_' and '.' and spaces become _ and two hex digits; letters, digits and '-' stay."""
    assert SERVICE.session_log_id("my.app", "u_1", "s 1") == "adk.s.my_2eapp.u_5f1.s_201"
    assert SERVICE.user_log_id("my.app", "ann") == "adk.u.my_2eapp.ann"
    assert SERVICE.app_log_id("é-1") == "adk.a.é-1"


def test_an_id_past_the_limit_is_refused() -> None:
    """Past 235 bytes the service refuses the id with a message that says what to shorten."""
    with pytest.raises(ValueError, match="235"):
        SERVICE.session_log_id("app", "user", "x" * 230)
    with pytest.raises(errors.InvalidSessionId):
        check_session_id("adk.s.app.user." + "x" * 230)  # what the server would have said


def stored(event: AdkEvent) -> tuple[int, dict[str, object]]:
    """The type and data of the event storing ``event``, checked as the server checks it."""
    made = event_of_adk(event, {"k": 1})
    assert check_event(Event.FromString(made.SerializeToString()), 0) is None
    assert adk_event_of(made) == event
    assert struct_to_dict(made.state_delta) == {"k": 1}
    return made.type, struct_to_dict(made.data)


def content(role: str, *parts: types.Part) -> types.Content:
    return types.Content(role=role, parts=list(parts))


def test_user_text_is_a_user_message() -> None:
    """The user's text parts, joined, are the content of a user message."""
    kind, data = stored(
        AdkEvent(author="user", content=content("user", types.Part(text="a"), types.Part(text="b")))
    )
    assert kind == EventType.EVENT_TYPE_USER_MESSAGE
    assert data["content"] == "a\nb"
    assert data["author"] == "user"


def test_model_text_thoughts_and_calls_are_one_assistant_message() -> None:
    """Text is the content, thoughts the reasoning, function calls the tool calls."""
    call = types.FunctionCall(id="c1", name="lookup", args={"q": "x"})
    kind, data = stored(
        AdkEvent(
            author="helper",
            content=content(
                "model",
                types.Part(text="hmm", thought=True),
                types.Part(text="calling"),
                types.Part(function_call=call),
            ),
        )
    )
    assert kind == EventType.EVENT_TYPE_ASSISTANT_MESSAGE
    assert (data["content"], data["reasoning_content"]) == ("calling", "hmm")
    assert data["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    ]


def test_function_responses_are_a_tool_result() -> None:
    """One response names its call; several name the first and list every call id."""
    one = types.FunctionResponse(id="c1", name="lookup", response={"hits": 2})
    kind, data = stored(
        AdkEvent(author="helper", content=content("user", types.Part(function_response=one)))
    )
    assert kind == EventType.EVENT_TYPE_TOOL_RESULT
    assert (data["tool_call_id"], data["name"], json.loads(str(data["content"]))) == (
        "c1",
        "lookup",
        {"hits": 2},
    )
    two = types.FunctionResponse(id="c2", name="lookup", response={"hits": 3})
    kind, data = stored(
        AdkEvent(
            author="helper",
            content=content(
                "user", types.Part(function_response=one), types.Part(function_response=two)
            ),
        )
    )
    assert kind == EventType.EVENT_TYPE_TOOL_RESULT
    assert data["metadata"] == {"tool_call_ids": ["c1", "c2"]}
    assert json.loads(str(data["content"])) == [{"hits": 2}, {"hits": 3}]


def test_events_without_text_or_calls_are_bookkeeping() -> None:
    """A state-only event, an image from the user and an empty model turn keep their place as
    STEP_END events, outside the derived view."""
    image = types.Part.from_bytes(data=b"\x89PNG", mime_type="image/png")
    for event in [
        AdkEvent(author="helper", actions=EventActions(state_delta={"x": 1})),
        AdkEvent(author="user", content=content("user", image)),
        AdkEvent(author="helper", content=content("model")),
    ]:
        kind, data = stored(event)
        assert kind == EventType.EVENT_TYPE_STEP_END
        assert "content" not in data


def test_the_event_time_is_the_adk_timestamp() -> None:
    """The sessionlog event's time is the ADK event's timestamp, to the microsecond."""
    made = event_of_adk(AdkEvent(author="user", timestamp=1700000000.123456))
    assert made.time.ToMicroseconds() == 1700000000123456
