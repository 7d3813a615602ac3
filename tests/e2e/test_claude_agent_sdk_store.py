"""sessionlog_client.claude_agent_sdk against a real server and the Claude Agent SDK itself: the
SDK's own SessionStore conformance harness, what it does not check (a retried batch stored once,
subagent transcripts erased with their session, summaries that go stale when another writer
appends), the SDK's store-backed listing, and the README's example run as written."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk._internal.session_summary import fold_session_summary
from claude_agent_sdk.testing import run_session_store_conformance, session_store_conformance
from claude_agent_sdk.types import SessionKey

from sessionlog.testing import RunningServer
from sessionlog_client import AsyncClient, event
from sessionlog_client._routing import LOG
from sessionlog_client.claude_agent_sdk import SessionlogSessionStore, event_of_entry
from sessionlog_client.claude_agent_sdk import _summary_title as summary_title
from tests.e2e._examples import assert_example_prints_what_it_says
from tests.e2e._proc import running_server

_ids = count()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module; each store uses its own prefix."""
    folder: Path = tmp_path_factory.mktemp("claude-agent-sdk")
    with running_server(folder / "data") as server:
        yield server


def new_prefix() -> str:
    return f"cl{next(_ids)}-{os.getpid()}."


def run(
    running: RunningServer,
    test: Callable[[SessionlogSessionStore, AsyncClient], Awaitable[None]],
) -> None:
    """Run ``test(store, client)`` on a fresh loop with a store and a raw client."""

    async def main() -> None:
        async with AsyncClient(running.address) as client:
            await test(SessionlogSessionStore(client, prefix=new_prefix()), client)

    asyncio.run(main())


def entry(uuid: str, kind: str = "user", text: str = "hi", **more: Any) -> Any:
    """A transcript line as the CLI writes it (the parts the store and the summary look at)."""
    return {
        "type": kind,
        "uuid": uuid,
        "timestamp": "2026-01-01T00:00:00.000Z",
        "message": {"role": kind, "content": [{"type": "text", "text": text}]},
        **more,
    }


MAIN: SessionKey = {"project_key": "-home-ann-proj", "session_id": "0b9e-4c1d"}
SUB: SessionKey = {**MAIN, "subpath": "subagents/agent-7"}


def test_the_sdk_conformance_harness_passes(running: RunningServer) -> None:
    """run_session_store_conformance passes with every optional method checked, none skipped."""

    async def main() -> None:
        async with AsyncClient(running.address) as client:
            probe = SessionlogSessionStore(client)
            optional = ("list_sessions", "list_session_summaries", "delete", "list_subkeys")
            skipped = [
                m
                for m in optional
                if not session_store_conformance._has_optional(probe, m, frozenset())
            ]
            assert skipped == []
            await run_session_store_conformance(
                lambda: SessionlogSessionStore(client, prefix=new_prefix())
            )

    asyncio.run(main())


def test_a_retried_batch_is_stored_once(running: RunningServer) -> None:
    """The same entries appended again (the SDK's retry) add no event and leave the summary."""

    async def test(store: SessionlogSessionStore, client: AsyncClient) -> None:
        batch = [entry("u1", text="first question"), entry("a1", kind="assistant", text="answer")]
        await store.append(MAIN, batch)
        summaries = await store.list_session_summaries(MAIN["project_key"])
        await store.append(MAIN, batch)
        assert await store.load(MAIN) == batch
        session = (await client.get_session(store.session_log_id(MAIN))).session
        assert session.event_count == 2
        assert await store.list_session_summaries(MAIN["project_key"]) == summaries
        # entries without uuids (titles, tags) are appended each time, as the SDK asks
        tag: Any = {"type": "tag", "tag": "x"}
        await store.append(MAIN, [tag])
        await store.append(MAIN, [tag])
        assert await store.load(MAIN) == [*batch, tag, tag]

    run(running, test)


class TitleReads(AsyncClient):
    """An AsyncClient that counts GetSession calls (the store's title reads)."""

    reads = 0

    async def get_session(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        return await super().get_session(*args, **kwargs)


def test_appends_in_a_row_fold_the_summary_without_reading_it_back(
    running: RunningServer,
) -> None:
    """A store's appends in a row read no title (it folds into the summary it wrote last); one
    after another writer's append reads it again, and the summary covers both writers."""

    async def main() -> None:
        prefix = new_prefix()
        mine, theirs = TitleReads(running.address), AsyncClient(running.address)
        async with mine, theirs:
            store = SessionlogSessionStore(mine, prefix=prefix)
            other = SessionlogSessionStore(theirs, prefix=prefix)
            await store.append(MAIN, [entry("u1", text="first question")])
            mine.reads = 0
            for n in range(5):
                await store.append(MAIN, [entry(f"a{n}", kind="assistant", text=f"a{n}")])
            assert mine.reads == 0
            titled: Any = {"type": "custom-title", "customTitle": "theirs"}
            await other.append(MAIN, [titled])
            await store.append(MAIN, [entry("u2", text="second")])
            assert mine.reads == 1
            [summary] = await store.list_session_summaries(MAIN["project_key"])
            folded = fold_session_summary(None, MAIN, await store.load(MAIN) or [])
            assert summary["data"] == folded["data"]
            assert summary["data"]["custom_title"] == "theirs"

    asyncio.run(main())


class Calls(AsyncClient):
    """An AsyncClient that counts its unary calls by name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    async def _call(
        self,
        method: str,
        request: Any,
        timeout: float | None,  # noqa: ASYNC109 - the signature of the method it wraps
        *,
        retry: bool,
        stub: str = LOG,
    ) -> Any:
        self.calls.append(method)
        return await super()._call(method, request, timeout, retry=retry, stub=stub)


def test_an_append_is_one_call_that_writes_entries_and_summary(running: RunningServer) -> None:
    """After its first, each append of a store is one Append (one synced commit), and the title
    it sets is the summary of the whole transcript."""

    async def main() -> None:
        client = Calls(running.address)
        async with client:
            store = SessionlogSessionStore(client, prefix=new_prefix())
            await store.append(MAIN, [entry("u1", text="first question")])
            client.calls.clear()
            for n in range(3):
                await store.append(MAIN, [entry(f"a{n}", kind="assistant", text=f"a{n}")])
            assert client.calls == ["Append"] * 3
            [summary] = await store.list_session_summaries(MAIN["project_key"])
            [listed] = await store.list_sessions(MAIN["project_key"])
            folded = fold_session_summary(None, MAIN, await store.load(MAIN) or [])
            assert summary["data"] == folded["data"]
            assert summary["mtime"] == listed["mtime"]

    asyncio.run(main())


def test_a_first_append_to_a_new_session_is_one_append(running: RunningServer) -> None:
    """A store's first append to a session is one Append, no GetSession (it names expected_seq
    0); a fresh store's first append to a session holding events is refused, reads the title
    and appends, and the summary covers both stores' entries."""

    async def main() -> None:
        prefix = new_prefix()
        first, second = Calls(running.address), Calls(running.address)
        async with first, second:
            store = SessionlogSessionStore(first, prefix=prefix)
            await store.append(MAIN, [entry("u1", text="first question", customTitle="one")])
            assert first.calls == ["Append"]
            resumed = SessionlogSessionStore(second, prefix=prefix)
            await resumed.append(MAIN, [entry("a1", kind="assistant", text="answer")])
            assert second.calls == ["Append", "GetSession", "Append"]
            [summary] = await resumed.list_session_summaries(MAIN["project_key"])
            folded = fold_session_summary(None, MAIN, await resumed.load(MAIN) or [])
            assert summary["data"] == folded["data"]
            assert summary["data"]["custom_title"] == "one"
            session = (await second.get_session(resumed.session_log_id(MAIN))).session
            assert session.event_count == 2

    asyncio.run(main())


def test_a_session_deleted_and_made_again_to_the_same_length_is_folded_anew(
    running: RunningServer,
) -> None:
    """Another store deletes the session and writes as many entries again: this store's next
    append does not fold onto the summary of the deleted transcript."""

    async def test(store: SessionlogSessionStore, client: AsyncClient) -> None:
        other = SessionlogSessionStore(client, prefix=store.prefix)
        await store.append(MAIN, [entry("u1", text="the old question")])
        await other.delete(MAIN)
        await other.append(MAIN, [entry("u2", text="the new question")])
        await store.append(MAIN, [entry("a2", kind="assistant", text="answer")])
        [summary] = await store.list_session_summaries(MAIN["project_key"])
        folded = fold_session_summary(None, MAIN, await store.load(MAIN) or [])
        assert summary["data"] == folded["data"]
        assert "the old question" not in str(summary["data"])

    run(running, test)


def test_sessions_written_by_the_two_call_store_load_and_list(running: RunningServer) -> None:
    """A session the earlier store wrote (an Append, then UpdateSession of the title) loads and
    lists as it did, and appending to it keeps its summary whole."""

    async def test(store: SessionlogSessionStore, client: AsyncClient) -> None:
        old = [entry("u1", text="asked before", customTitle="kept"), entry("a1", kind="assistant")]
        log_id = store.session_log_id(MAIN)
        reply = await client.append(log_id, [event_of_entry(e) for e in old])
        summary = fold_session_summary(None, MAIN, old)
        await client.update_session(log_id, title=summary_title(reply.next_seq, summary["data"]))
        assert await store.load(MAIN) == old
        [listed] = await store.list_session_summaries(MAIN["project_key"])
        assert listed["data"] == summary["data"]
        await store.append(MAIN, [entry("u2", text="asked now")])
        [listed] = await store.list_session_summaries(MAIN["project_key"])
        folded = fold_session_summary(None, MAIN, await store.load(MAIN) or [])
        assert listed["data"] == folded["data"]
        assert listed["data"]["custom_title"] == "kept"

    run(running, test)


def test_delete_erases_the_subagent_sessions(running: RunningServer) -> None:
    """Subagent transcripts are child sessions of the main one, and delete erases them too."""

    async def test(store: SessionlogSessionStore, client: AsyncClient) -> None:
        await store.append(SUB, [entry("s1", text="sub first")])  # before the main transcript
        await store.append(MAIN, [entry("m1")])
        main_id = store.session_log_id(MAIN)
        children = await client.children(main_id)
        assert [c.session_id for c in children] == [store.session_log_id(SUB)]
        assert children[0].title == "subagents/agent-7"
        assert await store.list_subkeys(MAIN) == ["subagents/agent-7"]
        await store.delete(MAIN)
        for log_id in (main_id, store.session_log_id(SUB)):
            assert not (await client.get_session(log_id)).session.exists
        assert await store.load(SUB) is None

    run(running, test)


def test_a_summary_another_writer_outran_is_reported_stale(running: RunningServer) -> None:
    """Events appended beside the store make its summary older than the session, so the SDK
    re-folds; the store's next append folds the whole transcript again."""

    async def test(store: SessionlogSessionStore, client: AsyncClient) -> None:
        await store.append(MAIN, [entry("u1", customTitle="one")])
        other = SessionlogSessionStore(client, prefix=store.prefix)
        log_id = store.session_log_id(MAIN)
        title = (await client.get_session(log_id)).session.title
        await other.append(MAIN, [entry("u2", customTitle="two")])
        await client.update_session(log_id, title=title)  # as if the second update were lost
        [listed] = await store.list_sessions(MAIN["project_key"])
        [summary] = await store.list_session_summaries(MAIN["project_key"])
        assert summary["mtime"] < listed["mtime"]
        await store.append(MAIN, [entry("u3")])
        [listed] = await store.list_sessions(MAIN["project_key"])
        [summary] = await store.list_session_summaries(MAIN["project_key"])
        assert summary["mtime"] == listed["mtime"]
        assert summary["data"]["custom_title"] == "two"

    run(running, test)


def test_the_conversation_shows_in_the_derived_view(running: RunningServer) -> None:
    """User text, assistant text and tool calls, and tool results project to chat messages."""

    async def test(store: SessionlogSessionStore, client: AsyncClient) -> None:
        call = {"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a"}}
        result = {"type": "tool_result", "tool_use_id": "t1", "content": "file text"}
        entries: list[Any] = [
            entry("u1", text="read a"),
            {
                "type": "assistant",
                "uuid": "a1",
                "message": {"role": "assistant", "content": [call]},
            },
            {"type": "user", "uuid": "u2", "message": {"role": "user", "content": [result]}},
            {"type": "system", "uuid": "s1", "subtype": "compact_boundary"},
        ]
        await store.append(MAIN, entries)
        messages = await client.chat_messages(store.session_log_id(MAIN))
        assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
        assert messages[1]["tool_calls"][0]["function"]["name"] == "Read"
        assert messages[2] == {"role": "tool", "content": "file text", "tool_call_id": "t1"}

    run(running, test)


def test_the_sdk_lists_sessions_from_the_store(running: RunningServer, tmp_path: Path) -> None:
    """The SDK's list_sessions_from_store reads titles and prompts from the summaries."""
    from claude_agent_sdk._internal.sessions import (
        _canonicalize_path,
        _sanitize_path,
        list_sessions_from_store,
    )

    project = _sanitize_path(_canonicalize_path(str(tmp_path)))

    async def test(store: SessionlogSessionStore, client: AsyncClient) -> None:
        for n in range(3):
            key: SessionKey = {"project_key": project, "session_id": f"s-{n}"}
            await store.append(key, [entry(f"u{n}", text=f"question {n}", cwd=str(tmp_path))])
        infos = await list_sessions_from_store(store, directory=str(tmp_path))
        assert sorted(i.summary for i in infos) == ["question 0", "question 1", "question 2"]

    run(running, test)


def test_the_readme_example_runs(running: RunningServer) -> None:
    """client/python/README.md's Claude Agent SDK example prints what its ``# ->`` lines say."""
    assert_example_prints_what_it_says("### Claude Agent SDK", running.address)


def test_a_long_transcript_loads_whole_past_other_writers_events(running: RunningServer) -> None:
    """load of a transcript longer than one Since response returns every entry in order, each
    exactly as appended, and leaves out an event another writer appended to the session."""

    async def test(store: SessionlogSessionStore, client: AsyncClient) -> None:
        entries = [entry(f"u{i}", text=f"{i} " + "y" * 2000) for i in range(300)]
        await store.append(MAIN, entries[:150])
        await client.append(store.session_log_id(MAIN), [event("user_message", {"content": "x"})])
        await store.append(MAIN, entries[150:])
        assert await store.load(MAIN) == entries

    run(running, test)
