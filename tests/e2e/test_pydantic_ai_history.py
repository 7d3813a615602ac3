"""sessionlog_client.pydantic_ai against a real server and Pydantic AI itself: every message part
type round trips through save_messages / load_messages, the derived view shows the conversation,
and an Agent run's history, saved and reloaded, carries a second run (TestModel and FunctionModel,
no network)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import typing
import warnings
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai import _deferred_capabilities as capabilities
from pydantic_ai import _tool_search as tool_search
from pydantic_ai import messages as m
from pydantic_ai.exceptions import PydanticAIDeprecationWarning
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RequestUsage

from sessionlog.testing import RunningServer
from sessionlog_client import AsyncClient, Client, event_type
from sessionlog_client.pydantic_ai import (
    load_messages,
    load_messages_async,
    save_messages,
    save_messages_async,
)
from tests.e2e._proc import run_cli_here, running_server

_ids = count()
WHEN = dt.datetime(2026, 5, 4, 3, 2, 1, 123456, tzinfo=dt.UTC)
PNG = b"\x89PNG\r\n\x1a\n\x00\x01"


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module; each test writes its own sessions."""
    folder: Path = tmp_path_factory.mktemp("pydantic-ai")
    with running_server(folder / "data") as server:
        yield server


@pytest.fixture
def thread_loop() -> Iterator[None]:
    """An event loop set for this thread, closed afterwards: Agent.run_sync drives the thread's
    loop (making one when there is none) and leaves it open."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def new_id() -> str:
    return f"pa-{next(_ids)}"


def part_classes(union: Any) -> set[type]:
    """The part classes of one of pydantic_ai's discriminated part unions."""
    members = typing.get_args(typing.get_args(union)[0])
    return {typing.get_args(member)[0] for member in members}


def legacy_retry() -> m.RetryPromptPart:
    """A RetryPromptPart: deprecated (it warns when built), still in the request part union,
    so histories saved by older versions hold it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PydanticAIDeprecationWarning)
        return m.RetryPromptPart("answer in JSON", timestamp=WHEN)


def request_parts() -> list[Any]:
    retry: m.RetryInfo[m.RetryFeedbackCause] = m.RetryInfo("model_retry", attempt=1, max_retries=3)
    return [
        m.SystemPromptPart("Be brief.", timestamp=WHEN),
        m.UserPromptPart("What is LMDB?", timestamp=WHEN),
        m.UserPromptPart(
            [
                "Describe these:",
                m.ImageUrl("https://example.com/a.png"),
                m.AudioUrl("https://example.com/a.mp3"),
                m.DocumentUrl("https://example.com/a.pdf"),
                m.VideoUrl("https://example.com/a.mp4"),
                m.BinaryContent(PNG, media_type="image/png"),
                m.CachePoint(),
            ],
            timestamp=WHEN,
        ),
        m.SpeechPart(speaker="user", transcript="hello"),
        tool_search.ToolSearchReturnPart(
            content={"discovered_tools": [{"name": "lookup"}], "message": "found one"},
            tool_call_id="ts_1",
            timestamp=WHEN,
        ),
        capabilities.LoadCapabilityReturnPart(
            content={"message": "loaded"}, tool_call_id="lc_1", timestamp=WHEN
        ),
        m.ToolReturnPart("lookup", {"found": True, "score": 0.5, "n": 3}, "call_1", timestamp=WHEN),
        m.ToolReturnPart("lookup", "try again", "call_2", outcome="retried", timestamp=WHEN),
        legacy_retry(),
        m.RetryFeedbackPart("no output", retry=retry, timestamp=WHEN),
        m.ToolAvailabilityDeltaPart(tools_added=["lookup"], tool_call_id="ts_1"),
        m.CapabilityLoadDeltaPart(loaded=["search"], tool_call_id="lc_1"),
        m.ModelSettingsDeltaPart(settings={"thinking": None}),
        m.InstructionDeltaPart(id=None, content="Be kind."),
        m.InstructionBaselinePart(instructions=[m.InstructionPart("Be brief.")]),
        m.CompactionPart(content="summary so far"),
    ]


def response_parts() -> list[Any]:
    return [
        m.TextPart("LMDB is a B+tree key-value store."),
        tool_search.ToolSearchCallPart(args={"queries": ["weather"]}, tool_call_id="ts_1"),
        capabilities.LoadCapabilityCallPart(args={"id": "search"}, tool_call_id="lc_1"),
        m.ToolCallPart("lookup", {"word": "lmdb", "limit": 1.0}, "call_1"),
        m.ToolCallPart("lookup", '{"word": "go"}', "call_2"),
        tool_search.NativeToolSearchCallPart(args={"queries": ["w"]}, tool_call_id="nts_1"),
        m.NativeToolCallPart("web_search", {"query": "lmdb"}, "ws_1", provider_name="openai"),
        tool_search.NativeToolSearchReturnPart(
            content={"discovered_tools": []}, tool_call_id="nts_1", timestamp=WHEN
        ),
        m.NativeToolReturnPart("web_search", [{"url": "u"}], "ws_1", timestamp=WHEN),
        m.ThinkingPart("thinking about B+trees", signature="sig", provider_name="anthropic"),
        m.CompactionPart(content="kept", id="cmp_2"),
        m.FilePart(m.BinaryContent(PNG, media_type="image/png")),
        m.SpeechPart(speaker="assistant", transcript="hi"),
    ]


def every_part_messages() -> list[m.ModelMessage]:
    return [
        m.ModelRequest(parts=request_parts(), timestamp=WHEN, instructions="Be brief."),
        m.ModelResponse(
            parts=response_parts(),
            usage=RequestUsage(input_tokens=12, output_tokens=34),
            model_name="fake-1",
            timestamp=WHEN,
            provider_name="fake",
            provider_response_id="resp_1",
            finish_reason="stop",
        ),
        m.ModelRequest(parts=[], timestamp=WHEN),
    ]


def test_the_samples_cover_every_part_type_pydantic_ai_defines() -> None:
    """The messages hold one part of each class pydantic_ai's request and response unions
    name, no more, no fewer."""
    assert {type(p) for p in request_parts()} == part_classes(m.ModelRequestPart)
    assert {type(p) for p in response_parts()} == part_classes(m.ModelResponsePart)


def through_json(messages: list[m.ModelMessage]) -> list[m.ModelMessage]:
    """``messages`` after pydantic_ai's own JSON round trip, which fills in what it infers (a
    URL's media type, BinaryContent narrowed to BinaryImage) and reads a legacy RetryPromptPart
    as the part that replaces it."""
    adapter = m.ModelMessagesTypeAdapter
    again: list[m.ModelMessage] = adapter.validate_json(adapter.dump_json(messages))
    return again


def test_every_part_type_round_trips(running: RunningServer) -> None:
    """load_messages returns what ModelMessagesTypeAdapter's own JSON round trip returns, every
    part type and field included (timestamps, usage, binary content, a whole float in tool
    arguments)."""
    sent = every_part_messages()
    with Client(running.address) as client:
        sid = new_id()
        save_messages(client, sid, sent[:1])
        save_messages(client, sid, sent[1:])
        back = load_messages(client, sid)
    assert back == through_json(sent)
    adapter = m.ModelMessagesTypeAdapter
    assert adapter.dump_json(back) == adapter.dump_json(through_json(sent))
    args = back[1].parts[3]
    assert isinstance(args, m.ToolCallPart)
    assert args.args == {"word": "lmdb", "limit": 1.0}
    assert type(typing.cast("dict[str, Any]", args.args)["limit"]) is float


def test_the_derived_view_shows_the_conversation(running: RunningServer) -> None:
    """System and user prompts, text, tool calls and tool returns are surface events that
    DeriveMessages shows; thinking and native tool parts keep their place off the surface."""
    sent: list[m.ModelMessage] = [
        m.ModelRequest(parts=[m.SystemPromptPart("Be brief."), m.UserPromptPart("What is LMDB?")]),
        m.ModelResponse(
            parts=[
                m.ThinkingPart("hmm"),
                m.NativeToolCallPart("web_search", {"q": "lmdb"}, "ws_1"),
                m.ToolCallPart("lookup", {"word": "lmdb"}, "call_1"),
            ]
        ),
        m.ModelRequest(parts=[m.ToolReturnPart("lookup", "a store", "call_1")]),
        m.ModelResponse(parts=[m.TextPart("A store.")]),
    ]
    with Client(running.address) as client:
        sid = new_id()
        save_messages(client, sid, sent)
        chat = client.chat_messages(sid)
        with client.since(sid) as stream:
            types = [e.type for e in stream]
    assert [c["role"] for c in chat] == ["system", "user", "assistant", "tool", "assistant"]
    assert [c["content"] for c in chat[:2]] == ["Be brief.", "What is LMDB?"]
    call = chat[2]["tool_calls"][0]
    assert (call["id"], call["function"]) == (
        "call_1",
        {"name": "lookup", "arguments": '{"word": "lmdb"}'},
    )
    assert (chat[3]["tool_call_id"], chat[3]["name"], chat[3]["content"]) == (
        "call_1",
        "lookup",
        "a store",
    )
    assert chat[4]["content"] == "A store."
    assert types[2:4] == [event_type("step_end"), event_type("tool_call")]


def test_a_hidden_part_leaves_the_history(running: RunningServer) -> None:
    """A hide over the last part (pop_last) drops it from load_messages and `sessionlog items`;
    the log keeps it."""
    sent: list[m.ModelMessage] = [
        m.ModelRequest(parts=[m.UserPromptPart("q", timestamp=WHEN)], timestamp=WHEN),
        m.ModelResponse(parts=[m.TextPart("a"), m.TextPart("b")], timestamp=WHEN),
    ]
    with Client(running.address) as client:
        sid = new_id()
        save_messages(client, sid, sent)
        client.pop_last(sid)
        back = load_messages(client, sid)
        with client.since(sid) as stream:
            kept = len(list(stream))
    assert back == [sent[0], m.ModelResponse(parts=[m.TextPart("a")], timestamp=WHEN)]
    assert kept == 4
    shown = run_cli_here(["items", sid, "--server", running.address])
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(x["seq"], "message" in x, x["part"]["content"]) for x in lines] == [
        (0, True, "q"),
        (1, True, "a"),
    ]


@pytest.mark.usefixtures("thread_loop")
def test_an_agent_run_is_saved_and_carries_the_next_run(running: RunningServer) -> None:
    """A TestModel run's messages, saved and loaded, are the next run's history: the second
    run's model sees the first turn, and the session then holds both turns."""
    agent = Agent(TestModel(custom_output_text="first answer"), instructions="Be brief.")
    seen: list[list[m.ModelMessage]] = []

    def reply(messages: list[m.ModelMessage], info: AgentInfo) -> m.ModelResponse:
        seen.append(messages)
        return m.ModelResponse(parts=[m.TextPart("second answer")])

    with Client(running.address) as client:
        sid = new_id()
        first = agent.run_sync("What is LMDB?")
        save_messages(client, sid, first.all_messages())
        assert load_messages(client, sid) == first.all_messages()
        second = agent.run_sync(
            "And in Go?", message_history=load_messages(client, sid), model=FunctionModel(reply)
        )
        save_messages(client, sid, second.new_messages())
        assert second.output == "second answer"
        assert seen[0][: len(first.all_messages())] == first.all_messages()
        assert load_messages(client, sid) == second.all_messages()
        contents = [c["content"] for c in client.chat_messages(sid)]
    assert contents == ["What is LMDB?", "first answer", "And in Go?", "second answer"]


def test_the_async_helpers_round_trip(running: RunningServer) -> None:
    """save_messages_async / load_messages_async with an AsyncClient, around an async run."""

    async def run() -> None:
        agent = Agent(TestModel(custom_output_text="async answer"))
        async with AsyncClient(running.address) as client:
            sid = new_id()
            result = await agent.run("hi")
            await save_messages_async(client, sid, result.all_messages())
            assert await load_messages_async(client, sid) == result.all_messages()
            again = await agent.run("more", message_history=await load_messages_async(client, sid))
            await save_messages_async(client, sid, again.new_messages())
            assert await load_messages_async(client, sid) == again.all_messages()

    asyncio.run(run())
