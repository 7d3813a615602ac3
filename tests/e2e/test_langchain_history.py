"""sessionlog_client.langchain against a real server and langchain-core itself: the documented
``BaseChatMessageHistory`` contract (order kept, every message type round tripping, clear, the
async twins, two histories on one session), the derived view, a chain with a stub model, and
the README's example run as written."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda

from sessionlog.testing import RunningServer
from sessionlog_client import Client, event
from sessionlog_client.langchain import SessionlogChatMessageHistory
from tests.e2e._examples import assert_example_prints_what_it_says
from tests.e2e._proc import running_server

_ids = count()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module; each test uses sessions of its own."""
    folder: Path = tmp_path_factory.mktemp("langchain")
    with running_server(folder / "data") as server:
        yield server


@pytest.fixture
def client(running: RunningServer) -> Iterator[Client]:
    with Client(running.address) as opened:
        yield opened


def new_id() -> str:
    return f"lc{next(_ids)}-{os.getpid()}"


def every_type() -> list[BaseMessage]:
    """One message of each class, with the fields a plain JSON store would bend (a whole float,
    nested metadata, tool calls, ids, content parts)."""
    return [
        SystemMessage("Be brief.", id="m0"),
        HumanMessage(
            [{"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": "x"}}],
            id="m1",
            additional_kwargs={"k": [1, 2.0, None]},
        ),
        AIMessage(
            "Reading it.",
            id="m2",
            tool_calls=[{"name": "read", "args": {"path": "a", "n": 1.0}, "id": "c1"}],
            response_metadata={"model_name": "stub", "temperature": 1.0},
            usage_metadata={"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
        ),
        ToolMessage("file text", tool_call_id="c1", status="success", artifact={"bytes": 9}),
        FunctionMessage(content="42", name="answer"),
        ChatMessage(content="aside", role="critic"),
        AIMessageChunk(content="part", id="m6"),
        AIMessage(
            "",
            invalid_tool_calls=[
                {
                    "name": "bad",
                    "args": "{",
                    "id": "c2",
                    "error": "no JSON",
                    "type": "invalid_tool_call",
                }
            ],
        ),
    ]


def test_every_message_type_round_trips_in_order(client: Client) -> None:
    """Each message reads back equal and of its own class, in the order added, across adds."""
    history = SessionlogChatMessageHistory(new_id(), client)
    added = every_type()
    history.add_messages(added[:3])
    history.add_message(added[3])
    history.add_messages(added[4:])
    back = history.messages
    assert back == added
    assert [type(m) for m in back] == [type(m) for m in added]
    assert client.get_session(history.session_id).session.event_count == len(added)


def test_clear_hides_and_keeps_the_log(client: Client) -> None:
    """clear empties the history, keeps the events, and later messages show as usual."""
    history = SessionlogChatMessageHistory(new_id(), client)
    history.add_messages([HumanMessage("one"), AIMessage("two")])
    history.clear()
    assert history.messages == []
    assert client.get_session(history.session_id).session.event_count == 3
    history.add_user_message("three")
    assert history.messages == [HumanMessage("three")]
    assert [m["content"] for m in client.chat_messages(history.session_id)] == ["three"]
    history.clear()
    history.clear()  # nothing more to hide: still empty
    assert history.messages == []


def test_two_histories_on_one_session_see_each_others_writes(running: RunningServer) -> None:
    """Histories opened on the same id, by address, share one conversation."""
    session = new_id()
    first = SessionlogChatMessageHistory(session, running.address)
    second = SessionlogChatMessageHistory(session, running.address)
    try:
        first.add_user_message("hi")
        second.add_ai_message("hello")
        assert first.messages == second.messages == [HumanMessage("hi"), AIMessage("hello")]
        second.clear()
        assert first.messages == []
    finally:
        first.close()
        second.close()


def test_the_async_twins_with_an_address(running: RunningServer) -> None:
    """aadd_messages, aget_messages and aclear on the history's own async client, seen by a
    sync history on the same session."""
    session = new_id()

    async def main() -> None:
        history = SessionlogChatMessageHistory(session, running.address)
        try:
            await history.aadd_messages(every_type())
            assert await history.aget_messages() == every_type()
            with Client(running.address) as other:
                sync = SessionlogChatMessageHistory(session, other)
                assert sync.messages == every_type()
                sync.add_user_message("from sync")
            assert (await history.aget_messages())[-1] == HumanMessage("from sync")
            await history.aclear()
            assert await history.aget_messages() == []
        finally:
            await history.aclose()

    asyncio.run(main())


def test_the_async_twins_with_a_client(client: Client) -> None:
    """With a sync Client given, the async methods run the sync ones and store the same."""
    history = SessionlogChatMessageHistory(new_id(), client)

    async def main() -> None:
        await history.aadd_messages([HumanMessage("a"), AIMessage("b")])
        assert await history.aget_messages() == [HumanMessage("a"), AIMessage("b")]
        await history.aclear()
        assert await history.aget_messages() == []

    asyncio.run(main())
    assert client.get_session(history.session_id).session.event_count == 3


def test_the_conversation_shows_in_the_derived_view(client: Client) -> None:
    """System, human, AI (text and tool calls) and tool messages project to chat messages;
    function and chat messages stay out of the view."""
    history = SessionlogChatMessageHistory(new_id(), client)
    history.add_messages(every_type())
    shown = client.chat_messages(history.session_id)
    assert [m["role"] for m in shown] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "assistant",
    ]
    assert shown[1]["content"] == "Look:"
    call = shown[2]["tool_calls"][0]
    assert call["id"] == "c1"
    assert call["function"] == {"name": "read", "arguments": '{"path": "a", "n": 1.0}'}
    assert shown[3] == {"role": "tool", "content": "file text", "tool_call_id": "c1"}


def test_a_chain_with_a_stub_model_keeps_its_turns(running: RunningServer) -> None:
    """A prompt and a stub chat model fed from the history, each turn added back: the second
    call sees the first turn, and the session holds both."""
    prompt = ChatPromptTemplate.from_messages(
        [MessagesPlaceholder("history"), ("human", "{question}")]
    )
    seen: list[int] = []

    def stub(value: Any) -> AIMessage:
        seen.append(len(value.to_messages()))
        return AIMessage(["LMDB is a B+tree store.", "It is memory-mapped."][len(seen) - 1])

    chain = prompt | RunnableLambda(stub)
    history = SessionlogChatMessageHistory(new_id(), running.address)
    try:
        for question in ("What is LMDB?", "And?"):
            reply = chain.invoke({"history": history.messages, "question": question})
            history.add_messages([HumanMessage(question), reply])
        assert seen == [1, 3]
        with Client(running.address) as raw:
            assert [(m["role"], m["content"]) for m in raw.chat_messages(history.session_id)] == [
                ("user", "What is LMDB?"),
                ("assistant", "LMDB is a B+tree store."),
                ("user", "And?"),
                ("assistant", "It is memory-mapped."),
            ]
    finally:
        history.close()


class CountingClient(Client):
    """A client that counts the events its ListEvents pages and Since streams bring back."""

    events_read = 0

    def list_events(self, *args: Any, **kwargs: Any) -> Any:
        page = super().list_events(*args, **kwargs)
        self.events_read += len(page.events)
        return page

    def since(self, *args: Any, **kwargs: Any) -> Any:
        for found in super().since(*args, **kwargs):
            self.events_read += 1
            yield found


def test_history_size_reads_the_latest_messages_from_the_end(running: RunningServer) -> None:
    """With history_size=N, messages is the whole history's last N, read from the end of a
    600-message log (a few pages, not the log), past a summary another writer put over a range,
    hides at the end and a clear; 0 is no messages."""
    session = new_id()
    client = CountingClient(running.address)
    with client:
        whole = SessionlogChatMessageHistory(session, client)
        for batch in range(6):
            whole.add_messages([HumanMessage(f"m{batch}-{i}") for i in range(100)])
        summary = event("user_message", {"content": "a summary, not LangChain's"}, replace=(10, 20))
        client.append(session, [summary])
        for seq in range(599, 580, -1):
            client.hide(session, seq, seq)
        last = SessionlogChatMessageHistory(session, client, history_size=5)
        everything = whole.messages
        client.events_read = 0
        got = last.messages
        assert client.events_read <= 100, client.events_read  # two pages of 32 here
        assert got == everything[-5:]
        assert got[-1] == HumanMessage("m5-80")
        assert SessionlogChatMessageHistory(session, client, history_size=0).messages == []
        whole.clear()
        whole.add_user_message("after")
        assert last.messages == [HumanMessage("after")]
    with pytest.raises(ValueError, match="history_size"):
        SessionlogChatMessageHistory(session, running.address, history_size=-1)


def test_history_size_on_the_async_client(running: RunningServer) -> None:
    """aget_messages with history_size, on the history's own async client, reads the same last
    N as the sync one, an empty session none."""
    session = new_id()

    async def main() -> None:
        history = SessionlogChatMessageHistory(session, running.address, history_size=3)
        try:
            assert await history.aget_messages() == []
            await history.aadd_messages([HumanMessage(f"m{i}") for i in range(50)])
            got = await history.aget_messages()
            assert got == [HumanMessage("m47"), HumanMessage("m48"), HumanMessage("m49")]
            assert got == history.messages
        finally:
            await history.aclose()
            history.close()

    asyncio.run(main())


def test_the_readme_example_runs(running: RunningServer) -> None:
    """client/python/README.md's LangChain example prints what its ``# ->`` lines say."""
    assert_example_prints_what_it_says("### LangChain", running.address)
