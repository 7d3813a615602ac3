"""A sessionlog ``HistoryProvider`` for the Microsoft Agent Framework (``agent-framework-core``).

    from agent_framework import Agent
    from sessionlog_client.agent_framework import SessionlogHistoryProvider

    agent = Agent(client=..., context_providers=[SessionlogHistoryProvider("127.0.0.1:50051")])

Install with ``pip install 'sessionlog-client[agent-framework]'``.

- An Agent Framework session id is the sessionlog session ``{prefix}{session_id}`` (a session
  with no id is ``{prefix}default``).
- Each message is one event holding ``Message.to_dict()`` as JSON text in ``message_json``, so
  it reads back through ``Message.from_dict`` with every content kept; system, user and
  assistant text, function calls (as OpenAI ``tool_calls``) and function results project to the
  derived view; other messages are ``STEP_END``.
- ``save_messages`` keeps only the messages past what the session already holds (the
  framework's ``filter_new_messages``, as its file provider does) and appends them with
  ``expected_seq`` set to the length it read: a writer that appended meanwhile makes it read
  and filter again, so a replayed transcript is never stored twice.
- ``get_messages(session_id, limit=N)``, or every call of a provider made with
  ``history_size=N``, returns the latest N messages in view, read from the end of the log a
  page at a time (ListEvents newest first): a long history costs what its last N cost.
- A hide (``clear``) takes the messages so far out of view; the log keeps them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from sessionlog_client._aio import AsyncClient
from sessionlog_client._items import (
    get_exact,
    in_view,
    latest,
    position,
    put_exact,
    tail_page_size,
)
from sessionlog_client.errors import SeqConflict
from sessionlog_client.v1.event_pb2 import Event, EventType

try:
    from agent_framework import HistoryProvider, Message
    from agent_framework._sessions import filter_new_messages
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "sessionlog_client.agent_framework needs the Microsoft Agent Framework: "
        "pip install 'sessionlog-client[agent-framework]'"
    ) from exc

__all__ = ["SessionlogHistoryProvider", "event_of_message", "message_of_event"]

MESSAGE_KEY = "message"
"""``Message.to_dict()`` is kept as JSON text in the data key ``message_json``."""

_ROLES = {
    "system": EventType.EVENT_TYPE_SYSTEM_MESSAGE,
    "user": EventType.EVENT_TYPE_USER_MESSAGE,
    "assistant": EventType.EVENT_TYPE_ASSISTANT_MESSAGE,
}


def event_of_message(message: Message) -> Event:
    """The event storing ``message`` verbatim, plus what the derived view shows."""
    stored = message.to_dict()
    data: dict[str, Any] = {"message_role": str(message.role)}
    put_exact(data, MESSAGE_KEY, stored)
    contents = [c for c in stored.get("contents", []) if isinstance(c, dict)]
    results = [c for c in contents if c.get("type") == "function_result"]
    calls = [
        {
            "id": str(c.get("call_id") or ""),
            "type": "function",
            "function": {
                "name": str(c.get("name") or ""),
                "arguments": c["arguments"]
                if isinstance(c.get("arguments"), str)
                else json.dumps(c.get("arguments")),
            },
        }
        for c in contents
        if c.get("type") == "function_call"
    ]
    text = "\n".join(str(c["text"]) for c in contents if c.get("type") == "text" and "text" in c)
    kind = _ROLES.get(str(message.role), EventType.EVENT_TYPE_STEP_END)
    if results:
        kind = EventType.EVENT_TYPE_TOOL_RESULT
        first = results[0]
        data["tool_call_id"] = str(first.get("call_id") or "")
        result = first.get("result")
        data["content"] = result if isinstance(result, str) else json.dumps(result)
    elif kind == EventType.EVENT_TYPE_ASSISTANT_MESSAGE and calls:
        data["tool_calls"] = calls
        if text:
            data["content"] = text
    elif kind != EventType.EVENT_TYPE_STEP_END and text:
        data["content"] = text
    else:
        kind = EventType.EVENT_TYPE_STEP_END
    made = Event(type=kind)
    made.data.update(data)
    return made


def message_of_event(event: Event) -> Message | None:
    """The message an event stores, or None for an event that stores none (another writer's)."""
    found, stored = get_exact(event, MESSAGE_KEY)
    return Message.from_dict(stored) if found and isinstance(stored, dict) else None


def _visible(events: Sequence[Event], start: int = 0) -> list[Message]:
    """The stored messages no later hide or replace covers, in order; from position ``start``
    on when ``events`` is a tail of the log."""
    shown = (message_of_event(e) for e in in_view(events) if position(e) >= start)
    return [m for m in shown if m is not None]


def _checked(count: int | None, name: str) -> int | None:
    if count is not None and count < 0:
        raise ValueError(f"{name} must be 0 or more, not {count}")
    return count


class SessionlogHistoryProvider(HistoryProvider):
    """The Agent Framework's ``HistoryProvider`` on a sessionlog server.

    ``client`` is an :class:`~sessionlog_client.AsyncClient` (the caller's to close) or an
    address: then the provider opens one client per event loop, closed by :meth:`close`.
    ``history_size``: how many of the latest messages ``get_messages`` returns when the call
    gives no ``limit`` (all when None).
    """

    DEFAULT_SOURCE_ID = "sessionlog"

    def __init__(
        self,
        client: AsyncClient | str,
        *,
        prefix: str = "maf.",
        source_id: str | None = None,
        history_size: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__(source_id or self.DEFAULT_SOURCE_ID, **options)
        self.prefix = prefix
        self.history_size = _checked(history_size, "history_size")
        self._given = client if isinstance(client, AsyncClient) else None
        self._address = client if isinstance(client, str) else ""
        self._opened: dict[asyncio.AbstractEventLoop, AsyncClient] = {}

    def _client(self) -> AsyncClient:
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        for old in [lp for lp in self._opened if lp.is_closed()]:
            del self._opened[old]
        if loop not in self._opened:
            self._opened[loop] = AsyncClient(self._address)
        return self._opened[loop]

    async def close(self) -> None:
        """Close the client this provider opened for the running loop (none if one was given)."""
        opened = self._opened.pop(asyncio.get_running_loop(), None)
        if opened is not None:
            await opened.close()

    def log_id(self, session_id: str | None) -> str:
        """The sessionlog session holding ``session_id``'s history."""
        return f"{self.prefix}{session_id or 'default'}"

    async def _read(self, session_id: str | None) -> tuple[list[Message], int]:
        events = [e async for e in self._client().since(self.log_id(session_id))]
        return _visible(events), len(events)

    async def _latest(self, session_id: str | None, limit: int) -> list[Message]:
        """The latest ``limit`` messages in view, read newest first a page at a time."""
        tail: list[Event] = []
        token = ""
        while True:
            page = await self._client().list_events(
                self.log_id(session_id),
                page_size=tail_page_size(limit),
                page_token=token,
                order_by="seq desc",
            )
            tail.extend(page.events)
            token = page.next_page_token
            found = latest(tail, bool(token), limit, _visible)
            if found is not None:
                return found

    async def get_messages(
        self,
        session_id: str | None,
        *,
        state: dict[str, Any] | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> list[Message]:
        """The messages in view, oldest first; the latest ``limit`` of them (the provider's
        ``history_size`` when not given, all when neither is)."""
        limit = self.history_size if limit is None else _checked(limit, "limit")
        if limit is None:
            return (await self._read(session_id))[0]
        return await self._latest(session_id, limit)

    async def save_messages(
        self,
        session_id: str | None,
        messages: Sequence[Message],
        *,
        state: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Append the messages the session does not hold yet, in one atomic append."""
        while messages:
            existing, length = await self._read(session_id)
            new = filter_new_messages(existing, messages)
            if not new:
                return
            try:
                await self._client().append(
                    self.log_id(session_id),
                    [event_of_message(m) for m in new],
                    expected_seq=length,
                )
            except SeqConflict:
                continue  # another writer appended: read and filter again
            return

    async def clear(self, session_id: str | None) -> None:
        """Hide every message so far; the log keeps them."""
        await self._client().clear(self.log_id(session_id), reason="agent-framework clear")
