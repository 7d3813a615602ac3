"""sessionlog_client.openai_agents against a real server and the OpenAI Agents SDK itself: every
item type round trips, the SDK's session scenarios, hides that DeriveMessages agrees with, and
Runner.run / run_sync / run_streamed with a fake model."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import typing
from collections.abc import AsyncIterator, Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.memory import Session
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_input_item_param import ResponseInputItemParam

from sessionlog.testing import RunningServer
from sessionlog_client import AsyncClient, errors, event, event_type
from sessionlog_client._items import in_view
from sessionlog_client.openai_agents import (
    SessionlogSession,
    event_items,
    item_to_event,
    plain_items,
    visible_items,
)
from tests.e2e._proc import run_cli_here, running_server

_ids = count()

SAMPLES: dict[str, dict[str, Any]] = {
    "EasyInputMessageParam": {"role": "user", "content": "What is LMDB?"},
    "Message": {
        "type": "message",
        "role": "developer",
        "content": [
            {"type": "input_text", "text": "Be brief."},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0K", "detail": "low"},
            {"type": "input_file", "file_id": "file-1", "filename": "a.pdf"},
        ],
    },
    "ResponseOutputMessageParam": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": "A key-value store.", "annotations": []},
            {"type": "refusal", "refusal": "Not that part."},
        ],
    },
    "ResponseFileSearchToolCallParam": {
        "id": "fs_1",
        "type": "file_search_call",
        "queries": ["lmdb"],
        "status": "completed",
        "results": [{"file_id": "file-1", "score": 0.75, "text": "mmap"}],
    },
    "ResponseComputerToolCallParam": {
        "id": "cu_1",
        "call_id": "call_cu",
        "type": "computer_call",
        "status": "completed",
        "pending_safety_checks": [],
        "action": {"type": "click", "button": "left", "x": 10, "y": 20},
    },
    "ComputerCallOutput": {
        "call_id": "call_cu",
        "type": "computer_call_output",
        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA"},
    },
    "ResponseFunctionWebSearchParam": {
        "id": "ws_1",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "lmdb"},
    },
    "ResponseFunctionToolCallParam": {
        "type": "function_call",
        "call_id": "call_1",
        "name": "lookup",
        "arguments": '{"word": "lmdb"}',
        "id": "fc_1",
        "status": "completed",
    },
    "FunctionCallOutput": {"type": "function_call_output", "call_id": "call_1", "output": "found"},
    "ToolSearchCall": {"type": "tool_search_call", "arguments": {"query": "weather"}},
    "ResponseToolSearchOutputItemParamParam": {"type": "tool_search_output", "tools": []},
    "AdditionalTools": {"type": "additional_tools", "role": "developer", "tools": []},
    "ResponseConfigurationUpdateItemParamParam": {"type": "configuration_update"},
    "ResponseReasoningItemParam": {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "thinking about storage"}],
        "encrypted_content": "gAAAA",
    },
    "ResponseCompactionItemParamParam": {"type": "compaction", "encrypted_content": "cmp"},
    "ImageGenerationCall": {
        "id": "ig_1",
        "type": "image_generation_call",
        "status": "completed",
        "result": None,
    },
    "ResponseCodeInterpreterToolCallParam": {
        "id": "ci_1",
        "type": "code_interpreter_call",
        "status": "completed",
        "code": "print(1)",
        "container_id": "cntr_1",
        "outputs": [{"type": "logs", "logs": "1\n"}],
    },
    "LocalShellCall": {
        "id": "ls_1",
        "type": "local_shell_call",
        "call_id": "call_ls",
        "status": "completed",
        "action": {"type": "exec", "command": ["ls"], "env": {}, "timeout_ms": 1000},
    },
    "LocalShellCallOutput": {"id": "ls_1", "type": "local_shell_call_output", "output": "a\n"},
    "ShellCall": {"type": "shell_call", "call_id": "call_sh", "action": {"commands": ["pwd"]}},
    "ShellCallOutput": {
        "type": "shell_call_output",
        "call_id": "call_sh",
        "output": [{"stdout": "/", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
    },
    "ApplyPatchCall": {
        "type": "apply_patch_call",
        "call_id": "call_ap",
        "status": "completed",
        "operation": {"type": "create_file", "path": "a.txt", "diff": "+a"},
    },
    "ApplyPatchCallOutput": {
        "type": "apply_patch_call_output",
        "call_id": "call_ap",
        "status": "completed",
    },
    "McpListTools": {"id": "ml_1", "type": "mcp_list_tools", "server_label": "s", "tools": []},
    "McpApprovalRequest": {
        "id": "ma_1",
        "type": "mcp_approval_request",
        "server_label": "s",
        "name": "rm",
        "arguments": "{}",
    },
    "McpApprovalResponse": {
        "type": "mcp_approval_response",
        "approval_request_id": "ma_1",
        "approve": False,
    },
    "McpCall": {
        "id": "mc_1",
        "type": "mcp_call",
        "server_label": "s",
        "name": "ls",
        "arguments": "{}",
    },
    "ResponseCustomToolCallOutputParam": {
        "type": "custom_tool_call_output",
        "call_id": "call_ct",
        "output": [{"type": "input_text", "text": "patched"}],
    },
    "ResponseCustomToolCallParam": {
        "type": "custom_tool_call",
        "call_id": "call_ct",
        "name": "patch",
        "input": "*** Begin Patch",
    },
    "CompactionTrigger": {"type": "compaction_trigger"},
    "ItemReference": {"id": "msg_0", "type": "item_reference"},
    "Program": {"id": "pg_1", "type": "program", "call_id": "c", "code": "x", "fingerprint": "f"},
    "ProgramOutput": {
        "id": "po_1",
        "type": "program_output",
        "call_id": "c",
        "result": "ok",
        "status": "completed",
    },
}
UNKNOWN = {"type": "hologram_call_2031", "depth": 1.0, "big": 2**60, "nested": {"n": [1, 2.5]}}


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module; each test writes its own sessions."""
    folder: Path = tmp_path_factory.mktemp("openai-agents")
    with running_server(folder / "data") as server:
        yield server


def new_id() -> str:
    return f"oa-{next(_ids)}"


def items(*dicts: dict[str, Any]) -> list[TResponseInputItem]:
    return typing.cast("list[TResponseInputItem]", list(dicts))


def say(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": text}


async def derived(client: AsyncClient, session_id: str) -> list[int]:
    """The seqs DeriveMessages shows."""
    return list((await client.derive_messages(session_id)).seqs)


SURFACE_TYPES = {
    event_type(name)
    for name in ("user_message", "assistant_message", "system_message", "tool_result")
}


async def surface_seqs_of_items(session: SessionlogSession) -> list[int]:
    """The seqs of the items in view that are surface events (what DeriveMessages must show)."""
    return [
        entry.seq
        for entry in await session.get_entries()
        if item_to_event(entry.item).type in SURFACE_TYPES
    ]


def test_the_samples_cover_every_item_type_the_sdk_defines() -> None:
    """One sample per member of the SDK's TResponseInputItem union, no more, no fewer."""
    members = {cls.__name__ for cls in typing.get_args(ResponseInputItemParam)}
    assert members == set(SAMPLES)


def test_session_satisfies_the_sdk_protocol(running: RunningServer) -> None:
    """The SDK's runtime check of its Session protocol accepts the class."""
    session = SessionlogSession(new_id(), running.address)
    assert isinstance(session, Session)
    assert session.session_settings is not None
    assert session.session_settings.limit is None


def test_every_item_type_round_trips(running: RunningServer) -> None:
    """get_items returns exactly what add_items stored, for every item type and an unknown one
    (floats that are whole, ints past 2^53), in order, each value of the same JSON type."""

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            session = SessionlogSession(new_id(), client)
            stored = [*SAMPLES.values(), UNKNOWN]
            await session.add_items(items(*stored[:10]))
            await session.add_items(items(*stored[10:]))
            back: list[Any] = await session.get_items()
            assert back == stored
            assert json.dumps(back) == json.dumps(stored)  # key order and number types too
            assert type(back[-1]["depth"]) is float
            assert back[-1]["big"] == 2**60

    asyncio.run(run())


def test_items_map_to_surface_and_bookkeeping_events(running: RunningServer) -> None:
    """Messages, function calls and their outputs show in DeriveMessages as the conversation;
    reasoning and hosted tool calls keep their place in the log but are not shown."""

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            sid = new_id()
            session = SessionlogSession(sid, client)
            await session.add_items(
                items(
                    SAMPLES["Message"],
                    SAMPLES["EasyInputMessageParam"],
                    SAMPLES["ResponseReasoningItemParam"],
                    SAMPLES["ResponseFunctionToolCallParam"],
                    SAMPLES["FunctionCallOutput"],
                    SAMPLES["ResponseFunctionWebSearchParam"],
                    SAMPLES["ResponseOutputMessageParam"],
                )
            )
            chat = await client.chat_messages(sid)
            assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "assistant"]
            assert chat[0]["content"] == "Be brief."
            assert chat[1]["content"] == "What is LMDB?"
            call = chat[2]["tool_calls"][0]
            assert (call["id"], call["function"]["name"]) == ("call_1", "lookup")
            assert (chat[3]["tool_call_id"], chat[3]["content"]) == ("call_1", "found")
            assert chat[4]["content"] == "A key-value store.\nNot that part."
            types = [e.type async for e in client.since(sid)]
            assert types[2] == event_type("step_end")
            assert types[5] == event_type("tool_call")

    asyncio.run(run())


def test_a_whole_read_of_old_and_mixed_logs_reads_each_event_as_before(
    running: RunningServer,
) -> None:
    """A log across more than one Since response as earlier releases wrote it (item events,
    texts with ASCII escapes or whitespace around them, an item text that is not an object, a
    foreign message, a summary, hides) reads back whole exactly as event_items read each event
    in view one at a time, and the latest items agree with it."""

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            sid = new_id()
            session = SessionlogSession(sid, client)
            big = "x" * 3000
            stored = [say("user", f"{i} {big}") for i in range(200)]  # about 600 kB of items
            await session.add_items(items(*stored))
            escaped = event("step_end", {"item_type": "reasoning", "item_json": '{"t": "\\u00e9"}'})
            spaced = event("step_end", {"item_type": "x", "item_json": ' \n{"type": "x"} '})
            listed = event("user_message", {"item_type": "x", "item_json": "[1]", "content": "l"})
            foreign = event("assistant_message", {"content": "from elsewhere"})
            summary = event("user_message", {"content": "[0-9]"}, replace=(0, 9))
            await client.append(sid, [escaped, spaced, listed, foreign, summary])
            await client.hide(sid, 50, 59)
            await client.hide(sid, 150, 150)
            events = [e async for e in client.since(sid)]
            expected = [item for e in in_view(events) for item in event_items(e)]
            whole = await session.get_items()
            assert whole == expected
            assert whole[0] == {"role": "user", "content": "[0-9]"}
            assert {"t": "\u00e9"} in whole
            assert {"type": "x"} in whole
            assert {"role": "user", "content": "l"} in whole  # [1] is no item: the message shows
            assert {"role": "assistant", "content": "from elsewhere"} in whole
            assert stored[50] not in whole
            assert stored[150] not in whole
            assert len(whole) == 200 - 10 + 1 - 10 - 1 + 4
            assert await session.get_items(limit=7) == whole[-7:]

    asyncio.run(run())


def test_plain_items_reads_a_plain_log_and_leaves_any_other_to_visible_items() -> None:
    """A log of item events alone reads as visible_items reads it; a hide, a replace, a
    foreign message or an item text that is not an object makes it None (pure)."""

    def stored(*events: Any) -> list[Any]:
        return [type(e).FromString(e.SerializeToString()) for e in events]

    made = [item_to_event(i) for i in (*SAMPLES.values(), UNKNOWN)]
    for seq, one in enumerate(made):
        one.seq = seq
    plain = stored(*made)
    assert plain_items(plain) == [e.item for e in visible_items(plain)]
    assert plain_items(plain) == [*SAMPLES.values(), UNKNOWN]
    assert plain_items([]) == []
    hide = event("user_message", {"content": "s"}, replace=(0, 0))
    foreign = event("user_message", {"content": "hi"})
    not_object = event("step_end", {"item_json": "[1]"})
    for other in (hide, foreign, not_object):
        assert plain_items(stored(*made, other)) is None


def test_separate_sessions_stay_separate(running: RunningServer) -> None:
    """Two sessions on one client see only their own items; clearing one leaves the other."""

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            one, two = SessionlogSession(new_id(), client), SessionlogSession(new_id(), client)
            await one.add_items(items(say("user", "for one")))
            await two.add_items(items(say("user", "for two")))
            assert await one.get_items() == [say("user", "for one")]
            assert await two.get_items() == [say("user", "for two")]
            await one.clear_session()
            assert await one.get_items() == []
            assert await two.get_items() == [say("user", "for two")]

    asyncio.run(run())


def test_limit_returns_the_latest_items_in_order(running: RunningServer) -> None:
    """get_items(limit) is the latest N in chronological order, the settings' limit the
    default, and a limit past the end everything."""

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            sid = new_id()
            session = SessionlogSession(sid, client)
            stored = [say("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(5)]
            await session.add_items(items(*stored))
            assert await session.get_items(limit=2) == stored[-2:]
            assert await session.get_items(limit=0) == []
            assert await session.get_items(limit=-1) == stored  # as SQLiteSession: no limit
            assert await session.get_items(limit=50) == stored
            limited = SessionlogSession(sid, client, session_settings={"limit": 3})
            assert await limited.get_items() == stored[-3:]
            assert await limited.get_items(limit=1) == stored[-1:]

    asyncio.run(run())


class CountingClient(AsyncClient):
    """A client that counts the events its ListEvents pages and Since streams bring back."""

    events_read = 0
    pages = 0

    async def list_events(self, *args: Any, **kwargs: Any) -> Any:
        page = await super().list_events(*args, **kwargs)
        self.pages += 1
        self.events_read += len(page.events)
        return page

    def since(self, *args: Any, **kwargs: Any) -> Any:
        return CountedStream(super().since(*args, **kwargs), self)


class CountedStream:
    """A Since stream whose events, read one at a time or a batch at a time, are counted."""

    def __init__(self, stream: Any, client: CountingClient) -> None:
        self.stream, self.client = stream, client

    async def __aenter__(self) -> CountedStream:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stream.aclose()

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for found in self.stream:
            self.client.events_read += 1
            yield found

    async def batches(self) -> AsyncIterator[Any]:
        async for batch in self.stream.batches():
            self.client.events_read += len(batch)
            yield batch


def test_a_limit_reads_the_end_of_a_long_log_past_its_hides(running: RunningServer) -> None:
    """On 300 items whose last 60 are hidden one by one (a hide each, newest first, so the
    hides fill the first pages read), get_items(limit=3) equals the whole read's last 3 and
    reads a few pages from the end, not the log; a summary replacing a range and a pop agree
    with the whole read too."""

    async def run() -> None:
        client = CountingClient(running.address)
        async with client:
            sid = new_id()
            session = SessionlogSession(sid, client)
            stored = [say("user", f"m{i}") for i in range(300)]
            await session.add_items(items(*stored))
            for seq in range(299, 239, -1):
                await client.hide(sid, seq, seq)
            client.events_read = client.pages = 0
            latest = await session.get_items(limit=3)
            assert latest == stored[237:240]
            assert latest == (await session.get_items())[-3:]
            assert 0 < client.pages <= 5
            client.events_read = 0
            assert await session.get_items(limit=3) == latest
            assert client.events_read < 360 // 2  # the whole log is 360 events
            summary = event("user_message", {"content": "[m200-m239]"}, replace=(200, 239))
            await client.append(sid, [summary])
            whole = await session.get_items()
            assert whole[-2:] == [stored[199], {"role": "user", "content": "[m200-m239]"}]
            for limit in (1, 2, 3, 7):
                assert await session.get_items(limit=limit) == whole[-limit:]
            assert await session.pop_item() == whole[-1]
            assert await session.get_items(limit=2) == whole[-3:-1]

    asyncio.run(run())


def test_pop_returns_newest_first_then_none(running: RunningServer) -> None:
    """pop_item hides and returns items newest first, bookkeeping ones included, then None; the
    log keeps every item and DeriveMessages agrees with get_items after each pop."""

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            sid = new_id()
            session = SessionlogSession(sid, client)
            stored = [
                say("user", "q"),
                SAMPLES["ResponseReasoningItemParam"],
                say("assistant", "a"),
            ]
            await session.add_items(items(*stored))
            for expected in reversed(stored):
                assert await session.pop_item() == expected
                assert await derived(client, sid) == await surface_seqs_of_items(session)
            assert await session.pop_item() is None
            assert await session.get_items() == []
            assert await derived(client, sid) == []
            kept = [e async for e in client.since(sid)]
            assert len(kept) == 6  # three items and three hides
            await session.add_items(items(say("user", "again")))
            assert await session.get_items() == [say("user", "again")]
            assert await derived(client, sid) == [6]

    asyncio.run(run())


def test_concurrent_pops_take_different_items(running: RunningServer) -> None:
    """Three pops at once (three clients) return the three items, each once: a pop that lost the
    race (SEQ_CONFLICT on its expected_seq) reads the log again."""

    async def run() -> None:
        sid = new_id()
        stored = [say("user", f"m{i}") for i in range(3)]
        clients = [AsyncClient(running.address) for _ in range(3)]
        try:
            await SessionlogSession(sid, clients[0]).add_items(items(*stored))
            popped = await asyncio.gather(
                *(SessionlogSession(sid, client).pop_item() for client in clients)
            )
            assert sorted(json.dumps(p) for p in popped) == sorted(json.dumps(i) for i in stored)
            assert await SessionlogSession(sid, clients[0]).get_items() == []
        finally:
            for client in clients:
                await client.close()

    asyncio.run(run())


class CallCounter(AsyncClient):
    """An AsyncClient that counts the reads and appends the session makes through it."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.calls: collections.Counter[str] = collections.Counter()

    async def list_events(self, *args: Any, **kwargs: Any) -> Any:
        self.calls["ListEvents"] += 1
        return await super().list_events(*args, **kwargs)

    def since(self, *args: Any, **kwargs: Any) -> Any:
        self.calls["Since"] += 1
        return super().since(*args, **kwargs)

    async def append(self, *args: Any, **kwargs: Any) -> Any:
        self.calls["Append"] += 1
        return await super().append(*args, **kwargs)


def test_pops_after_a_read_or_an_add_are_one_call_each(running: RunningServer) -> None:
    """Once the session has read or written the end of the log, each pop_item is one Append
    (the hide, with expected_seq) and no read; the items come back newest first."""

    async def run() -> None:
        client = CallCounter(running.address)
        async with client:
            session = SessionlogSession(new_id(), client)
            stored = [say("user", f"m{i}") for i in range(40)]
            await session.add_items(items(*stored[:20]))
            assert await session.pop_item() == stored[19]  # a read, then the hide
            await session.add_items(items(*stored[19:]))
            client.calls.clear()
            popped = [await session.pop_item() for _ in range(30)]
            assert popped == stored[::-1][:30]
            assert client.calls == {"Append": 30}
            assert await session.get_items() == stored[:10]

    asyncio.run(run())


def test_a_run_of_pops_reads_the_log_again_once_per_doubling(running: RunningServer) -> None:
    """100 pops in a row on a log another session wrote: each hide covers an item, so the
    newest item in view sinks twice as deep per pop; a read that runs out of the remembered
    end reads past it (a page twice as deep), not one page further, so the reads stay few."""

    async def run() -> None:
        client = CallCounter(running.address)
        async with client:
            sid = new_id()
            stored = [say("user", f"m{i}") for i in range(120)]
            await SessionlogSession(sid, client).add_items(items(*stored))
            session = SessionlogSession(sid, client)
            client.calls.clear()
            popped = [await session.pop_item() for _ in range(100)]
            assert popped == stored[::-1][:100]
            assert client.calls["Append"] == 100
            assert client.calls["ListEvents"] <= 4
            assert await session.get_items() == stored[:20]

    asyncio.run(run())


def test_a_pop_after_another_writers_append_pops_that_item(running: RunningServer) -> None:
    """A session whose remembered end of the log is stale (another writer appended) has its
    hide refused by expected_seq, reads again and pops the other writer's item."""

    async def run() -> None:
        client = CallCounter(running.address)
        async with client, AsyncClient(running.address) as other:
            sid = new_id()
            session = SessionlogSession(sid, client)
            await session.add_items(items(say("user", "a"), say("user", "b")))
            assert await session.get_items(limit=1) == [say("user", "b")]
            await SessionlogSession(sid, other).add_items(items(say("user", "theirs")))
            await SessionlogSession(sid, other).pop_item()
            await SessionlogSession(sid, other).add_items(items(say("user", "later")))
            client.calls.clear()
            assert await session.pop_item() == say("user", "later")
            assert client.calls["ListEvents"] == 1
            assert await session.pop_item() == say("user", "b")
            assert await session.get_items() == [say("user", "a")]

    asyncio.run(run())


def test_a_pop_after_the_session_was_made_again_to_the_same_length_pops_the_new_item(
    running: RunningServer,
) -> None:
    """Another writer deletes the session and writes as many items again: the session's
    remembered end of the log names the old session (expected_uid), so its hide is refused and
    it pops the new newest item, not the deleted one."""

    async def run() -> None:
        async with AsyncClient(running.address) as client, AsyncClient(running.address) as other:
            sid = new_id()
            session = SessionlogSession(sid, client)
            await session.add_items(items(say("user", "a"), say("user", "b")))
            assert await session.get_items(limit=1) == [say("user", "b")]
            await other.delete_session(sid)
            await SessionlogSession(sid, other).add_items(items(say("user", "x"), say("user", "y")))
            assert await session.pop_item() == say("user", "y")
            assert await session.get_items() == [say("user", "x")]

    asyncio.run(run())


def test_clear_empties_the_view_and_keeps_the_history(running: RunningServer) -> None:
    """clear_session hides everything; items added after it are the whole view; a fork at a
    seq before the clear still has the items."""

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            sid = new_id()
            session = SessionlogSession(sid, client)
            await session.add_items(items(say("user", "a"), SAMPLES["McpCall"], say("user", "b")))
            await session.clear_session()
            assert await session.get_items() == []
            assert await derived(client, sid) == []
            await session.clear_session()  # clearing an empty view is fine
            await session.add_items(items(say("user", "c")))
            assert await session.get_items() == [say("user", "c")]
            assert await derived(client, sid) == await surface_seqs_of_items(session)
            child = new_id()
            await client.fork_session(sid, session_id=child, at_seq=2)
            forked = SessionlogSession(child, client)
            assert await forked.get_items() == [
                say("user", "a"),
                SAMPLES["McpCall"],
                say("user", "b"),
            ]

    asyncio.run(run())


def test_a_summary_another_writer_appends_shows_in_get_items(running: RunningServer) -> None:
    """A replace that summarizes three items (written with the plain client) takes their place
    in get_items as DeriveMessages shows it; a seeded assistant tool call reads as a function
    call; pop_item takes the summary off again."""

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            sid = new_id()
            session = SessionlogSession(sid, client)
            await session.add_items(
                items(say("user", "a"), SAMPLES["ResponseReasoningItemParam"], say("user", "b"))
            )
            summary = event("user_message", {"content": "[a and b]"}, replace=(0, 2))
            call = {"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            seeded = event("assistant_message", {"tool_calls": [call]})
            await client.append(sid, [summary, seeded])
            assert await session.get_items() == [
                {"role": "user", "content": "[a and b]"},
                {"type": "function_call", "call_id": "c9", "name": "f", "arguments": "{}"},
            ]
            assert [e.seq for e in await session.get_entries()] == await derived(client, sid)
            assert await session.pop_item() == {
                "type": "function_call",
                "call_id": "c9",
                "name": "f",
                "arguments": "{}",
            }
            assert await session.pop_item() == {"role": "user", "content": "[a and b]"}
            assert await session.get_items() == []
            assert await derived(client, sid) == []

    asyncio.run(run())


def test_the_cli_prints_the_items_in_view(running: RunningServer) -> None:
    """`sessionlog items` prints each stored item in view as a JSON line with its seq (a popped
    one left out), and `sessionlog messages` the conversation they show."""

    async def write(sid: str) -> None:
        async with AsyncClient(running.address) as client:
            session = SessionlogSession(sid, client)
            await session.add_items(
                items(say("user", "q"), SAMPLES["ResponseFunctionToolCallParam"], say("user", "x"))
            )
            await session.pop_item()

    sid = new_id()
    asyncio.run(write(sid))
    shown = run_cli_here(["items", sid, "--server", running.address])
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert lines == [
        {"seq": 0, "item": say("user", "q")},
        {"seq": 1, "item": SAMPLES["ResponseFunctionToolCallParam"]},
    ]
    last = run_cli_here(["items", sid, "--last", "1", "--server", running.address])
    assert [json.loads(line)["seq"] for line in last.stdout.splitlines()] == [1]
    transcript = run_cli_here(["messages", sid, "--server", running.address])
    assert transcript.stdout.splitlines() == [
        "[0] user: q",
        "[1] assistant:",
        '      -> lookup({"word": "lmdb"})  [call call_1]',
    ]


def test_a_tenant_token_keeps_the_session_inside_its_prefix(tmp_path: Path) -> None:
    """Client options pass through (``token=``): a tenant's token writes and reads sessions under
    its prefix and is refused, writing nothing, outside it."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[token]]\nname = "tenant-a"\ntoken = "tenant-a-secret-0d9c2e7f"\n'
        'permissions = ["read", "write"]\nsession_prefix = "tenant-a."\n'
    )

    async def run(address: str) -> None:
        inside = SessionlogSession("tenant-a.chat", address, token="tenant-a-secret-0d9c2e7f")
        outside = SessionlogSession("tenant-b.chat", address, token="tenant-a-secret-0d9c2e7f")
        try:
            await inside.add_items(items(say("user", "mine")))
            assert await inside.get_items() == [say("user", "mine")]
            with pytest.raises(errors.PermissionDenied):
                await outside.add_items(items(say("user", "theirs")))
            with pytest.raises(errors.PermissionDenied):
                await outside.get_items()
        finally:
            await inside.close()
            await outside.close()

    with running_server(tmp_path / "data", auth_tokens=str(tokens)) as server:
        asyncio.run(run(server.address))


# -- the SDK's runner with a fake model -----------------------------------------------------------


def _message(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_fake",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class FakeModel(Model):
    """Calls the ``lookup`` tool once when the last input is a user message, then answers with
    the tool's output; counts the input items it was given."""

    def __init__(self) -> None:
        self.inputs: list[list[Any]] = []

    def _output(self, input: str | list[TResponseInputItem]) -> list[Any]:
        given = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        self.inputs.append(given)
        last: Any = given[-1]
        if last.get("type") == "function_call_output":
            return [_message(f"the answer is {last['output']}")]
        call_id = f"call_{len(self.inputs)}"
        return [
            ResponseFunctionToolCall(
                type="function_call", call_id=call_id, name="lookup", arguments='{"word": "x"}'
            )
        ]

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        return ModelResponse(output=self._output(input), usage=Usage(), response_id=None)

    async def stream_response(
        self, system_instructions: Any, input: Any, *a: Any, **k: Any
    ) -> AsyncIterator[TResponseStreamEvent]:
        response = Response.model_construct(
            id="resp_fake",
            created_at=0.0,
            model="fake",
            object="response",
            output=self._output(input),
            parallel_tool_calls=False,
            tool_choice="auto",
            tools=[],
            usage=None,
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )


@function_tool
def lookup(word: str) -> str:
    """Look a word up."""
    return f"{word}-42"


def _agent(model: FakeModel) -> Agent[Any]:
    return Agent(name="helper", instructions="Be brief.", model=model, tools=[lookup])


def _turn_types(got: list[Any]) -> list[str]:
    return [item.get("type", "message") for item in got]


TURN = ["message", "function_call", "function_call_output", "message"]
QUIET = RunConfig(tracing_disabled=True)  # no trace export (it would want an OpenAI key)


def test_runner_run_keeps_the_turn_and_reads_it_back(running: RunningServer) -> None:
    """Runner.run stores the user's input, the tool call, its output and the answer; a second
    run gives the model the first turn from the session."""

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            sid = new_id()
            session = SessionlogSession(sid, client)
            model = FakeModel()
            result = await Runner.run(_agent(model), "look up x", session=session, run_config=QUIET)
            assert result.final_output == "the answer is x-42"
            got = await session.get_items()
            assert _turn_types(got) == TURN
            assert got[0] == {"content": "look up x", "role": "user"}
            await Runner.run(_agent(model), "again", session=session, run_config=QUIET)
            assert len(model.inputs[2]) == 5  # the first turn's four items and the new input
            chat = await client.chat_messages(sid)
            assert [m["role"] for m in chat] == ["user", "assistant", "tool", "assistant"] * 2
            assert chat[3]["content"] == "the answer is x-42"

    asyncio.run(run())


def test_runner_run_streamed_keeps_the_turn(running: RunningServer) -> None:
    """Runner.run_streamed, streamed to the end, leaves the same turn in the session."""

    async def run() -> None:
        session = SessionlogSession(new_id(), running.address)
        try:
            result = Runner.run_streamed(
                _agent(FakeModel()), "look up x", session=session, run_config=QUIET
            )
            async for _ in result.stream_events():
                pass
            assert result.final_output == "the answer is x-42"
            assert _turn_types(await session.get_items()) == TURN
        finally:
            await session.close()

    asyncio.run(run())


def test_runner_run_sync_keeps_the_turn(running: RunningServer) -> None:
    """Runner.run_sync (its own event loop, so the session opens a client for it) stores the
    turn, read back afterwards from another loop."""
    session = SessionlogSession(new_id(), running.address)
    outcome: dict[str, Any] = {}

    def work() -> None:
        # run_sync runs on the thread's current loop and leaves it open by design: give it one
        # of ours, then close the client the session opened on it, and the loop.
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            outcome["result"] = Runner.run_sync(
                _agent(FakeModel()), "look up x", session=session, run_config=QUIET
            )
            loop.run_until_complete(session.close())
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    worker = threading.Thread(target=work)
    worker.start()
    worker.join(60)
    assert outcome["result"].final_output == "the answer is x-42"

    async def read() -> list[Any]:
        try:
            return await session.get_items()
        finally:
            await session.close()

    assert _turn_types(asyncio.run(read())) == TURN


class AnsweringModel(Model):
    """Answers every input with one message, under a response id (what lets the SDK compact)."""

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        return ModelResponse(
            output=[_message("LMDB is a B+tree store.")], usage=Usage(), response_id="resp_1"
        )

    def stream_response(self, *a: Any, **k: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError


class CompactingResponses:
    """A stand-in for ``AsyncOpenAI().responses``: ``compact`` returns a compaction item, and
    first lets another writer append to the session (a write during the compaction call)."""

    def __init__(self, during: typing.Callable[[], typing.Awaitable[None]]) -> None:
        self.during = during
        self.inputs: list[Any] = []

    async def compact(self, **kwargs: Any) -> Any:
        self.inputs.append(kwargs)
        await self.during()
        output = [{"type": "compaction", "encrypted_content": "cmp-1"}]
        return type("Compacted", (), {"output": output, "usage": None})()


def test_compaction_replaces_the_turn_and_keeps_a_concurrent_append(
    running: RunningServer,
) -> None:
    """The SDK's OpenAIResponsesCompactionSession around SessionlogSession compacts after a
    Runner turn by replacing the turn with one summary event (the log keeps the turn), and an
    item another writer appended while the compaction call ran stays in view after it; the
    SDK's own path (clear, then add the output) would have hidden it."""
    from agents.memory import OpenAIResponsesCompactionSession

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            sid = new_id()
            other = SessionlogSession(sid, client)
            late = {"role": "user", "content": "written during the compaction"}
            responses = CompactingResponses(lambda: other.add_items([late]))  # type: ignore[list-item]
            openai = typing.cast(Any, type("FakeOpenAI", (), {"responses": responses})())
            session = OpenAIResponsesCompactionSession(
                sid,
                SessionlogSession(sid, client),
                client=openai,
                should_trigger_compaction=lambda _context: True,
            )
            agent = Agent(name="helper", model=AnsweringModel())
            result = await Runner.run(agent, "What is LMDB?", session=session, run_config=QUIET)
            assert result.final_output == "LMDB is a B+tree store."
            assert len(responses.inputs) == 1
            assert await session.get_items() == [
                {"type": "compaction", "encrypted_content": "cmp-1"},
                late,
            ]
            stored = [e async for e in client.since(sid)]
            assert [e.type for e in stored] == [
                event_type("user_message"),
                event_type("assistant_message"),
                event_type("user_message"),  # the concurrent append
                event_type("user_message"),  # the summary, replacing positions 0 and 1
            ]
            assert (
                stored[3].surface_op.replace.start_seq,
                stored[3].surface_op.replace.stop_seq,
            ) == (0, 1)
            chat = await client.chat_messages(sid)
            assert [m.get("content") for m in chat] == [None, "written during the compaction"]

    asyncio.run(run())


def test_a_compaction_snapshot_whose_range_changed_writes_nothing(running: RunningServer) -> None:
    """replace_suffix of a snapshot whose items were popped meanwhile returns False and appends
    nothing; on an unchanged range it replaces only the suffix asked for."""

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            session = SessionlogSession(new_id(), client)
            items: list[Any] = [{"role": "user", "content": f"m{i}"} for i in range(4)]
            await session.add_items(items)
            stale = await session._get_compaction_snapshot(3)
            assert stale is not None
            assert (stale.items, stale.complete) == (items[1:], False)
            await session.pop_item()
            length = (await client.get_session(session.session_id)).session.event_count
            assert await stale.replace_suffix(1, [{"role": "user", "content": "S"}]) is False
            assert (await client.get_session(session.session_id)).session.event_count == length
            fresh = await session._get_compaction_snapshot(10)
            assert fresh is not None
            assert fresh.complete
            assert await fresh.replace_suffix(1, [{"role": "user", "content": "S"}]) is True
            assert await session.get_items() == [items[0], {"role": "user", "content": "S"}]
            assert [m["content"] for m in await client.chat_messages(session.session_id)] == [
                "m0",
                "S",
            ]

    asyncio.run(run())


def test_a_manual_compaction_replaces_the_history_in_one_event(running: RunningServer) -> None:
    """run_compaction() called by hand (the SDK's whole-history path) leaves the compaction's
    output in view through one summary event replacing the items, not a clear and an add: the
    log has no hide and keeps the items."""
    from agents.memory import OpenAIResponsesCompactionSession

    async def run() -> None:
        async with AsyncClient(running.address) as client:
            sid = new_id()
            items: list[Any] = [{"role": "user", "content": f"m{i}"} for i in range(3)]
            await SessionlogSession(sid, client).add_items(items)

            async def nothing() -> None:
                return None

            responses = CompactingResponses(nothing)
            openai = typing.cast(Any, type("FakeOpenAI", (), {"responses": responses})())
            session = OpenAIResponsesCompactionSession(
                sid, SessionlogSession(sid, client), client=openai, compaction_mode="input"
            )
            await session.run_compaction({"force": True})
            assert await session.get_items() == [
                {"type": "compaction", "encrypted_content": "cmp-1"}
            ]
            stored = [e async for e in client.since(sid)]
            assert event_type("hide") not in [e.type for e in stored]
            assert len(stored) == 4
            summary = stored[3].surface_op.replace
            assert (summary.start_seq, summary.stop_seq) == (0, 2)

    asyncio.run(run())
