"""sessionlog_client.agent_framework against a real server and agent-framework-core itself: the
``HistoryProvider`` contract (``get_messages`` / ``save_messages``: order kept, every content kind
round tripping, a replayed transcript stored once, two providers on one session, clear) and the
derived view."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Agent, BaseChatClient, ChatResponse, Content, Message

from sessionlog.testing import RunningServer
from sessionlog_client import AsyncClient
from sessionlog_client.agent_framework import SessionlogHistoryProvider, event_of_message
from tests.e2e._proc import running_server

_ids = count()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module; each provider uses its own prefix."""
    folder: Path = tmp_path_factory.mktemp("agent-framework")
    with running_server(folder / "data") as server:
        yield server


def run(
    running: RunningServer,
    test: Callable[[SessionlogHistoryProvider, AsyncClient], Awaitable[None]],
) -> None:
    async def main() -> None:
        async with AsyncClient(running.address) as client:
            prefix = f"maf{next(_ids)}-{os.getpid()}."
            await test(SessionlogHistoryProvider(client, prefix=prefix), client)

    asyncio.run(main())


def conversation() -> list[Message]:
    return [
        Message("system", ["Be brief."]),
        Message("user", ["What is in a.txt?"], message_id="u1"),
        Message(
            "assistant",
            [
                Content.from_text("Reading it."),
                Content.from_function_call(call_id="c1", name="read", arguments={"n": 1.0}),
            ],
        ),
        Message("tool", [Content.from_function_result(call_id="c1", result="hello")]),
        Message("assistant", ["It says hello."], additional_properties={"k": [1, None]}),
    ]


def dicts(messages: list[Message]) -> list[dict[str, object]]:
    return [m.to_dict() for m in messages]


def test_messages_round_trip_in_order(running: RunningServer) -> None:
    """Every message reads back with the same dict, in order, across saves."""

    async def test(provider: SessionlogHistoryProvider, client: AsyncClient) -> None:
        sent = conversation()
        await provider.save_messages("s", sent[:2])
        await provider.save_messages("s", sent[2:])
        assert dicts(await provider.get_messages("s")) == dicts(sent)
        assert await provider.get_messages("other") == []
        assert (await client.get_session(provider.log_id("s"))).session.event_count == 5

    run(running, test)


def test_a_replayed_transcript_is_stored_once(running: RunningServer) -> None:
    """save_messages with the whole transcript again (plus a new turn) adds only the new turn."""

    async def test(provider: SessionlogHistoryProvider, client: AsyncClient) -> None:
        sent = conversation()
        await provider.save_messages("s", sent[:3])
        await provider.save_messages("s", sent)
        assert dicts(await provider.get_messages("s")) == dicts(sent)
        assert (await client.get_session(provider.log_id("s"))).session.event_count == 5

    run(running, test)


def test_two_providers_share_a_session_and_clear_hides(running: RunningServer) -> None:
    """A second provider on the same prefix sees the first one's writes; clear empties the
    history and keeps the log."""

    async def test(provider: SessionlogHistoryProvider, client: AsyncClient) -> None:
        other = SessionlogHistoryProvider(running.address, prefix=provider.prefix)
        try:
            await provider.save_messages(None, [Message("user", ["hi"], message_id="a")])
            await other.save_messages(None, [Message("assistant", ["hello"], message_id="b")])
            assert [m.text for m in await provider.get_messages(None)] == ["hi", "hello"]
            await other.clear(None)
            assert await provider.get_messages(None) == []
            assert (await client.get_session(provider.log_id(None))).session.event_count == 3
        finally:
            await other.close()

    run(running, test)


def test_the_conversation_shows_in_the_derived_view(running: RunningServer) -> None:
    """System, user and assistant text, function calls and results project to chat messages."""

    async def test(provider: SessionlogHistoryProvider, client: AsyncClient) -> None:
        await provider.save_messages("s", conversation())
        shown = await client.chat_messages(provider.log_id("s"))
        assert [m["role"] for m in shown] == ["system", "user", "assistant", "tool", "assistant"]
        assert shown[2]["tool_calls"][0]["function"] == {"name": "read", "arguments": '{"n": 1.0}'}
        assert shown[3] == {"role": "tool", "content": "hello", "tool_call_id": "c1"}

    run(running, test)


class CountingClient(AsyncClient):
    """A client that counts the events its ListEvents pages and Since streams bring back."""

    events_read = 0

    async def list_events(self, *args: Any, **kwargs: Any) -> Any:
        page = await super().list_events(*args, **kwargs)
        self.events_read += len(page.events)
        return page

    async def since(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        async for found in super().since(*args, **kwargs):
            self.events_read += 1
            yield found


def test_a_limit_reads_the_latest_messages_from_the_end(running: RunningServer) -> None:
    """get_messages(limit=N), or a provider's history_size=N, is the whole history's last N,
    read from the end of a 600-message log (a few pages, not the log), past hides at the end
    and a clear; a negative count is refused."""

    async def main() -> None:
        client = CountingClient(running.address)
        async with client:
            provider = SessionlogHistoryProvider(client, prefix=f"maf-last-{os.getpid()}.")
            log_id = provider.log_id("s")
            for batch in range(6):
                sent = [Message("user", [f"m{batch}-{i}"]) for i in range(100)]
                await client.append(log_id, [event_of_message(m) for m in sent])
            for seq in range(599, 580, -1):
                await client.hide(log_id, seq, seq)
            everything = await provider.get_messages("s")
            client.events_read = 0
            got = await provider.get_messages("s", limit=4)
            assert client.events_read <= 100, client.events_read  # two pages of 32 here
            assert dicts(got) == dicts(everything[-4:])
            assert got[-1].text == "m5-80"
            sized = SessionlogHistoryProvider(client, prefix=provider.prefix, history_size=2)
            assert dicts(await sized.get_messages("s")) == dicts(everything[-2:])
            assert len(await sized.get_messages("s", limit=3)) == 3
            assert await provider.get_messages("s", limit=0) == []
            assert await provider.get_messages("none", limit=5) == []
            await provider.clear("s")
            await provider.save_messages("s", [Message("user", ["after"], message_id="z")])
            assert [m.text for m in await sized.get_messages("s")] == ["after"]
            with pytest.raises(ValueError, match="limit"):
                await provider.get_messages("s", limit=-1)

    asyncio.run(main())


class StubModel(BaseChatClient):
    """A chat client that answers with how many messages it was sent."""

    def _inner_get_response(
        self, *, messages: Any, stream: bool, options: Any, **kwargs: Any
    ) -> Any:
        async def answer() -> ChatResponse:
            return ChatResponse(messages=[Message("assistant", [f"saw {len(messages)}"])])

        return answer()


def test_an_agent_run_keeps_its_turns(running: RunningServer) -> None:
    """An Agent with the provider and a stub model: the second run is sent the first turn, and
    the session holds both turns."""

    async def test(provider: SessionlogHistoryProvider, client: AsyncClient) -> None:
        agent = Agent(client=StubModel(), context_providers=[provider])
        session = agent.create_session(session_id="chat")
        first = await agent.run("What is LMDB?", session=session)
        second = await agent.run("And?", session=session)
        assert (first.text, second.text) == ("saw 1", "saw 3")
        shown = await client.chat_messages(provider.log_id("chat"))
        assert [(m["role"], m["content"]) for m in shown] == [
            ("user", "What is LMDB?"),
            ("assistant", "saw 1"),
            ("user", "And?"),
            ("assistant", "saw 3"),
        ]

    run(running, test)
