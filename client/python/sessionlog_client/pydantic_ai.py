"""Pydantic AI message history in a sessionlog session: save a run's messages, load them back.

    from pydantic_ai import Agent
    from sessionlog_client import Client
    from sessionlog_client.pydantic_ai import load_messages, save_messages

    with Client("127.0.0.1:50051") as client:
        history = load_messages(client, "chat-42")
        result = agent.run_sync("And in Go?", message_history=history)
        save_messages(client, "chat-42", result.new_messages())

``save_messages`` appends: give it ``result.new_messages()`` when the run started from a loaded
history, ``result.all_messages()`` for a session that was empty. Install with
``pip install 'sessionlog-client[pydantic-ai]'``.

How messages become events (the README's "Framework backends" has the table). Each part of a
``ModelRequest`` or ``ModelResponse`` is one event, kept as pydantic_ai's own JSON form
(``ModelMessagesTypeAdapter``), as text, in the event's ``part_json``; the first event of a message
also keeps the message without its parts (``message_json``: kind, timestamps, usage, model name,
...), and a message with no parts is one event with no part. Loading regroups the parts under their
message and validates the list with ``ModelMessagesTypeAdapter``, so every part type round trips,
those added after this module was written included. Beside the stored JSON each event carries
what the derived view projects: system prompts are system messages, user prompts user messages,
text parts assistant messages, tool calls assistant messages with ``tool_calls``, tool returns and
retry prompts naming a tool are tool results; thinking parts, native (builtin) tool parts, files
and every other part are bookkeeping events (``TOOL_CALL`` for a part about a tool, ``STEP_END``
otherwise) that keep their place in the log.

A hide (``Client.hide``, ``pop_last``, ``clear``) takes parts out of what ``load_messages``
returns by the server's shadowing rule; a message whose first event is hidden is dropped whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from sessionlog_client._aio import AsyncClient
from sessionlog_client._items import get_exact, in_view, put_exact, text_of
from sessionlog_client._sync import Client
from sessionlog_client.v1.event_pb2 import Event, EventType

try:
    from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "sessionlog_client.pydantic_ai needs Pydantic AI: "
        "pip install 'sessionlog-client[pydantic-ai]'"
    ) from exc

__all__ = [
    "events_from_messages",
    "load_messages",
    "load_messages_async",
    "messages_from_events",
    "save_messages",
    "save_messages_async",
]

MESSAGE_KEY = "message"
"""A message's first event holds the message without its parts, as JSON text in ``message_json``."""
PART_KEY = "part"
"""Each event holds one part, as JSON text in ``part_json``."""
PART_KIND_KEY = "part_kind"
"""The data key naming the part's kind ("text", "tool-call", ...), for people and filters."""

_SURFACE_KINDS = {
    "system-prompt": EventType.EVENT_TYPE_SYSTEM_MESSAGE,
    "user-prompt": EventType.EVENT_TYPE_USER_MESSAGE,
    "text": EventType.EVENT_TYPE_ASSISTANT_MESSAGE,
    "tool-call": EventType.EVENT_TYPE_ASSISTANT_MESSAGE,
    "tool-return": EventType.EVENT_TYPE_TOOL_RESULT,
}
_USER_TEXT = {"text": "content"}
"""Text pieces of a user prompt's list content: plain strings and TextContent."""


# -- messages <-> events (pure) -----------------------------------------------------------------


def events_from_messages(messages: Sequence[ModelMessage]) -> list[Event]:
    """The events that store ``messages``: one per part (one for a message with none)."""
    dumped: list[dict[str, Any]] = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    events: list[Event] = []
    for message in dumped:
        parts = message.pop("parts", [])
        if not parts:
            events.append(_part_event(message, None))
        for i, part in enumerate(parts):
            events.append(_part_event(message if i == 0 else None, part))
    return events


def _part_event(message: dict[str, Any] | None, part: dict[str, Any] | None) -> Event:
    data: dict[str, Any] = {}
    if message is not None:
        put_exact(data, MESSAGE_KEY, message)
    type_ = EventType.EVENT_TYPE_STEP_END
    if part is not None:
        put_exact(data, PART_KEY, part)
        kind = str(part.get("part_kind", ""))
        data[PART_KIND_KEY] = kind
        type_ = _project(kind, part, data)
    made = Event(type=type_)
    made.data.update(data)
    return made


def _project(kind: str, part: dict[str, Any], data: dict[str, Any]) -> EventType:
    """The event type of a part, with the fields the derived view shows put in ``data``."""
    if kind == "retry-prompt":
        kind = "tool-return" if part.get("tool_name") else "user-prompt"
    type_ = _SURFACE_KINDS.get(kind)
    if type_ is None:
        return EventType.EVENT_TYPE_TOOL_CALL if "tool" in kind else EventType.EVENT_TYPE_STEP_END
    if kind == "tool-call":
        args = part.get("args")
        arguments = args if isinstance(args, str) or args is None else json.dumps(args)
        detail = {"name": part.get("tool_name"), "arguments": arguments}
        data["tool_calls"] = [
            {"id": part.get("tool_call_id"), "type": "function", "function": detail}
        ]
        return type_
    content = part.get("content")
    text = text_of(content, _USER_TEXT)
    if text is None and content is not None:
        text = json.dumps(content, ensure_ascii=False)
    if text is not None:
        data["content"] = text
    if kind == "tool-return":
        for key, field in (("tool_call_id", "tool_call_id"), ("name", "tool_name")):
            if isinstance(part.get(field), str):
                data[key] = part[field]
    return type_


def messages_from_events(events: Iterable[Event]) -> list[ModelMessage]:
    """The messages a log stores (its events in view), regrouped and validated."""
    plain: list[dict[str, Any]] = []
    open_message = False
    for event in in_view(events):
        has_message, message = get_exact(event, MESSAGE_KEY)
        has_part, part = get_exact(event, PART_KEY)
        if has_message and isinstance(message, dict):
            plain.append({**message, "parts": []})
            open_message = True
        elif not has_part:
            open_message = False  # not one of ours: a part after it starts nothing
            continue
        if has_part and open_message:
            plain[-1]["parts"].append(part)
    messages: list[ModelMessage] = ModelMessagesTypeAdapter.validate_python(plain)
    return messages


# -- the helpers --------------------------------------------------------------------------------


def save_messages(client: Client, session_id: str, messages: Sequence[ModelMessage]) -> int:
    """Append ``messages`` to the session in one atomic append; the session's next seq."""
    return int(client.append(session_id, events_from_messages(messages)).next_seq)


def load_messages(client: Client, session_id: str) -> list[ModelMessage]:
    """The session's messages, ready for ``message_history=``."""
    with client.since(session_id) as events:
        return messages_from_events(list(events))


async def save_messages_async(
    client: AsyncClient, session_id: str, messages: Sequence[ModelMessage]
) -> int:
    """:func:`save_messages` on an :class:`~sessionlog_client.AsyncClient`."""
    reply = await client.append(session_id, events_from_messages(messages))
    return int(reply.next_seq)


async def load_messages_async(client: AsyncClient, session_id: str) -> list[ModelMessage]:
    """:func:`load_messages` on an :class:`~sessionlog_client.AsyncClient`."""
    return messages_from_events([e async for e in client.since(session_id)])
