"""sessionlog_client.langgraph against a real server and LangGraph itself: the checkpointer
conformance suite (every capability), a stale writer refused instead of forking the thread, a
StateGraph that interrupts, resumes and travels back in time, and the client README's example."""

from __future__ import annotations

import asyncio
import operator
import re
from collections.abc import AsyncGenerator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import count
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt

from sessionlog.testing import RunningServer
from sessionlog_client import AsyncClient, Client
from sessionlog_client.langgraph import (
    SessionlogSaver,
    StaleThreadError,
    session_id_of,
    thread_id_of,
)
from tests.e2e._examples import assert_example_prints_what_it_says
from tests.e2e._proc import running_server

_ids = count()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the module; each test uses threads (and a prefix) of its own."""
    with running_server(tmp_path_factory.mktemp("langgraph") / "data") as server:
        yield server


def new_prefix() -> str:
    return f"lg{next(_ids)}."


def test_conformance_every_capability(running: RunningServer) -> None:
    """langgraph-checkpoint-conformance passes: the five required capabilities and the optional
    delete_for_runs, copy_thread (a fork) and prune."""

    @checkpointer_test(name="SessionlogSaver")
    async def factory() -> AsyncGenerator[SessionlogSaver, None]:
        saver = SessionlogSaver(running.address, prefix=new_prefix())
        try:
            yield saver
        finally:
            await saver.aclose()

    report = asyncio.run(validate(factory))
    results = {name: (r.passed, r.tests_passed, r.failures) for name, r in report.results.items()}
    assert set(results) == {c.value for c in ALL_CAPABILITIES}
    failed = {name: r for name, r in results.items() if r[0] is not True}
    assert not failed, failed
    assert sum(r[1] for r in results.values()) >= 80


def _put(saver: SessionlogSaver, thread: str, parent: str | None, step: int) -> str:
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    if parent:
        config["configurable"]["checkpoint_id"] = parent
    checkpoint = empty_checkpoint()
    stored = saver.put(config, checkpoint, {"source": "loop", "step": step}, {})
    return str(stored["configurable"]["checkpoint_id"])


def test_stale_writer_is_refused(running: RunningServer) -> None:
    """Two workers on one thread (LangGraph issue 8796): the one whose view is stale gets
    StaleThreadError, and the thread keeps one line of checkpoints."""
    prefix, thread = new_prefix(), "shared"
    with (
        SessionlogSaver(running.address, prefix=prefix) as one,
        SessionlogSaver(running.address, prefix=prefix) as two,
    ):
        first = _put(one, thread, None, 0)
        config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        assert one.get_tuple(config) is not None
        seen = two.get_tuple(config)
        assert seen is not None
        second = _put(one, thread, first, 1)
        with pytest.raises(StaleThreadError, match=second):
            _put(two, thread, first, 1)
        ids = [t.checkpoint["id"] for t in one.list(config)]
        assert ids == [second, first]
        # after reading again, the worker goes on from the latest
        latest = two.get_tuple(config)
        assert latest is not None
        assert latest.checkpoint["id"] == second
        third = _put(two, thread, second, 2)
        assert [t.checkpoint["id"] for t in one.list(config, limit=1)] == [third]


def test_stale_writer_is_refused_after_its_own_pending_writes(running: RunningServer) -> None:
    """A worker whose pending writes land after another worker's checkpoint is still stale:
    its own append does not move its view past a checkpoint it never read."""
    prefix, thread = new_prefix(), "shared"
    with (
        SessionlogSaver(running.address, prefix=prefix) as one,
        SessionlogSaver(running.address, prefix=prefix) as two,
    ):
        first = _put(one, thread, None, 0)
        config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        assert two.get_tuple(config) is not None
        second = _put(one, thread, first, 1)
        pending: RunnableConfig = {
            "configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": first}
        }
        two.put_writes(pending, [("messages", "late")], "task-2")
        with pytest.raises(StaleThreadError, match=second):
            _put(two, thread, first, 1)


def test_other_writers_pending_writes_do_not_refuse(running: RunningServer) -> None:
    """Pending writes and other namespaces appended by someone else since the read are not a
    fork: the put retries past them."""
    prefix, thread = new_prefix(), "busy"
    with (
        SessionlogSaver(running.address, prefix=prefix) as one,
        SessionlogSaver(running.address, prefix=prefix) as two,
    ):
        first = _put(one, thread, None, 0)
        root: RunnableConfig = {
            "configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": first}
        }
        two.put_writes(root, [("messages", "hi")], "task-1")
        child: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": "sub:1"}}
        two.put(child, empty_checkpoint(), {"step": 0}, {})
        second = _put(one, thread, first, 1)
        latest = one.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
        assert latest is not None
        assert latest.checkpoint["id"] == second


class CountingSaver(SessionlogSaver):
    """Counts the events its reads fetch from the server."""

    fetched = 0

    def _pages(self, session_id: str) -> Iterator[Any]:
        for page in super()._pages(session_id):
            self.fetched += len(page.events)
            yield page


def test_reads_stop_near_the_end(running: RunningServer) -> None:
    """The latest checkpoint, and a list with a limit, of a long thread read a few of its
    events, not all of them."""
    prefix, thread, length = new_prefix(), "long", 300
    with CountingSaver(running.address, prefix=prefix) as saver:
        parent = None
        for step in range(length):
            parent = _put(saver, thread, parent, step)
        config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        latest = saver.get_tuple(config)
        assert latest is not None
        assert latest.checkpoint["id"] == parent
        assert latest.metadata["step"] == length - 1
        assert saver.fetched <= 32
        saver.fetched = 0
        listed = list(saver.list(config, filter={"source": "loop"}, limit=5))
        assert [t.metadata["step"] for t in listed] == list(range(length - 1, length - 6, -1))
        assert saver.fetched <= 32
        saver.fetched = 0
        assert len(list(saver.list(config))) == length
        assert saver.fetched == length


def test_thread_ids_map_to_session_ids_and_back() -> None:
    """Any thread id becomes a valid session id that reads back as the same thread id."""
    for thread in ["t-1", "plain_id.2", "a b/ç:ü", "-", "日本"]:
        session = session_id_of("langgraph.", thread)
        assert re.fullmatch(r"langgraph\.[A-Za-z0-9_.-]+", session)
        assert thread_id_of("langgraph.", session) == thread


class State(TypedDict):
    steps: Annotated[list[str], operator.add]
    answer: str


START_STATE: State = {"steps": [], "answer": ""}


def plan(state: State) -> dict[str, Any]:
    return {"steps": ["plan"]}


def ask(state: State) -> dict[str, Any]:
    answer = interrupt("approve?")
    return {"steps": ["ask"], "answer": answer}


def act(state: State) -> dict[str, Any]:
    return {"steps": [f"act:{state['answer']}"]}


def build(saver: SessionlogSaver) -> CompiledStateGraph[Any, Any, Any, Any]:
    builder = StateGraph(State)
    builder.add_node("plan", plan)
    builder.add_node("ask", ask)
    builder.add_node("act", act)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "ask")
    builder.add_edge("ask", "act")
    builder.add_edge("act", END)
    return builder.compile(checkpointer=saver)


def test_graph_interrupt_resume_time_travel(running: RunningServer) -> None:
    """A StateGraph stops at an interrupt, a second saver (a restarted worker) resumes it,
    time travel forks from the checkpoint before the question, and durability="async" and
    ainvoke run too."""
    prefix, thread = new_prefix(), "graph"
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    with SessionlogSaver(running.address, prefix=prefix) as saver:
        out = build(saver).invoke(START_STATE, config)
        assert out["__interrupt__"][0].value == "approve?"
        assert out["steps"] == ["plan"]
    with SessionlogSaver(running.address, prefix=prefix) as later:
        graph = build(later)
        assert graph.get_state(config).next == ("ask",)
        out = graph.invoke(Command(resume="yes"), config)
        assert out["steps"] == ["plan", "ask", "act:yes"]
        history = list(graph.get_state_history(config))
        at_question = next(s for s in history if s.next == ("ask",))
        # replaying a past checkpoint replays its stored resume, as LangGraph's own savers do
        out = graph.invoke(Command(resume="no"), at_question.config)
        assert out["steps"] == ["plan", "ask", "act:yes"]
        # a fork: edit the past, then answer differently
        forked = graph.update_state(at_question.config, {"steps": ["edited"]})
        assert graph.get_state(forked).next == ("ask",)
        out = graph.invoke(Command(resume="no"), forked)
        assert out["steps"] == ["plan", "edited", "ask", "act:no"]
        now = graph.get_state(config)
        assert now.values["answer"] == "no"
        assert now.parent_config is not None
        # the log keeps both branches: the "yes" run's checkpoints are still listed
        assert len(list(graph.get_state_history(config))) > len(history)

        quick: RunnableConfig = {"configurable": {"thread_id": "quick"}}
        graph.invoke(START_STATE, quick, durability="async")
        out = graph.invoke(Command(resume="ok"), quick, durability="async")
        assert out["steps"] == ["plan", "ask", "act:ok"]

        async def run_async() -> dict[str, Any]:
            aconfig: RunnableConfig = {"configurable": {"thread_id": "async"}}
            await graph.ainvoke(START_STATE, aconfig)
            return await graph.ainvoke(Command(resume="async"), aconfig)

        assert asyncio.run(run_async())["steps"] == ["plan", "ask", "act:async"]
    with SessionlogSaver(running.address, prefix=prefix) as fresh:
        state = build(fresh).get_state(config)
        assert state.values == {"steps": ["plan", "edited", "ask", "act:no"], "answer": "no"}
        assert state.next == ()
    with Client(running.address) as client:
        sessions = [s.session_id for p in client.list_sessions(prefix=prefix) for s in p.sessions]
        assert sessions == [f"{prefix}async", f"{prefix}graph", f"{prefix}quick"]
        assert client.chat_messages(f"{prefix}graph") == []  # records are bookkeeping only


def concat(state: list[str] | None, writes: Sequence[list[str]]) -> list[str]:
    return [*(state or []), *(x for w in writes for x in w)]


class Growing(TypedDict):
    items: Annotated[list[str], DeltaChannel(concat, snapshot_frequency=3)]


def add_item(state: Growing) -> dict[str, Any]:
    return {"items": [f"item{len(state['items'])}"]}


def delta_history(saver: BaseCheckpointSaver[Any], runs: int) -> list[list[str]]:
    builder = StateGraph(Growing)
    builder.add_node("add", add_item)
    builder.add_edge(START, "add")
    builder.add_edge("add", END)
    graph = builder.compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": "delta"}}
    for _ in range(runs):
        graph.invoke({"items": []}, config)
    return [s.values.get("items", []) for s in graph.get_state_history(config)]


def test_delta_channel_history(running: RunningServer) -> None:
    """A DeltaChannel (values rebuilt from ancestors' writes between snapshots) reads back as
    LangGraph's in-memory saver reads it, at every checkpoint of the history, from a fresh
    saver too."""
    expected = delta_history(InMemorySaver(), 7)
    assert expected[0] == [f"item{i}" for i in range(7)]
    prefix = new_prefix()
    with SessionlogSaver(running.address, prefix=prefix) as saver:
        assert delta_history(saver, 7) == expected
    with SessionlogSaver(running.address, prefix=prefix) as fresh:
        assert delta_history(fresh, 0) == expected
        # keep_latest drops the ancestors the latest value is rebuilt from; the log keeps them
        fresh.prune(["delta"], strategy="keep_latest")
        assert delta_history(fresh, 0) == expected[:1]


def test_client_readme_example_runs(running: RunningServer) -> None:
    """The LangGraph example of client/python/README.md runs as shown and prints what it says."""
    assert_example_prints_what_it_says("### LangGraph", running.address)


class NoThreads(ThreadPoolExecutor):
    """A default executor that refuses work: a thread hop in the code under test fails it."""

    submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        NoThreads.submitted += 1
        raise RuntimeError("the async path ran something in a worker thread")


def _step(thread: str, parent: str | None, ns: str = "") -> RunnableConfig:
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
    if parent:
        config["configurable"]["checkpoint_id"] = parent
    return config


def test_async_methods_make_no_thread_hops(running: RunningServer) -> None:
    """Every async method runs in the event loop's own thread: with the default executor
    refusing work (and shut down), they store, read, list, copy, prune and delete."""
    prefix = new_prefix()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(NoThreads(max_workers=1))
        await loop.shutdown_default_executor()
        async with SessionlogSaver(running.address, prefix=prefix) as saver:
            parent = None
            for step in range(3):
                checkpoint = empty_checkpoint()
                checkpoint["channel_values"] = {"count": step}
                checkpoint["channel_versions"] = {"count": str(step + 1)}
                stored = await saver.aput(
                    _step("t", parent), checkpoint, {"step": step}, {"count": str(step + 1)}
                )
                parent = str(stored["configurable"]["checkpoint_id"])
                await saver.aput_writes(stored, [("count", step + 10)], f"task-{step}")
            latest = await saver.aget_tuple(_step("t", None))
            assert latest is not None
            assert latest.checkpoint["id"] == parent
            assert latest.checkpoint["channel_values"] == {"count": 2}
            assert latest.pending_writes == [("task-2", "count", 12)]
            listed = [t.metadata["step"] async for t in saver.alist(_step("t", None))]
            assert listed == [2, 1, 0]
            assert [t.metadata["step"] async for t in saver.alist(None, limit=2)] == [2, 1]
            history = await saver.aget_delta_channel_history(
                config=_step("t", parent), channels=["count"]
            )
            assert history["count"] == {"writes": [("task-1", "count", 11)], "seed": 1}
            await saver.acopy_thread("t", "copy")
            await saver.aprune(["copy"], strategy="keep_latest")
            assert [t.metadata["step"] async for t in saver.alist(_step("copy", None))] == [2]
            await saver.adelete_for_runs(["no-such-run"])
            await saver.adelete_thread("t")
            assert await saver.aget_tuple(_step("t", None)) is None

    NoThreads.submitted = 0
    asyncio.run(run())
    assert NoThreads.submitted == 0


class InFlight(AsyncClient):
    """Counts how many of its appends and reads are under way at once."""

    now = 0
    most = 0

    async def _call(self, *args: Any, **kwargs: Any) -> Any:
        InFlight.now += 1
        InFlight.most = max(InFlight.most, InFlight.now)
        try:
            return await super()._call(*args, **kwargs)
        finally:
            InFlight.now -= 1


def test_many_concurrent_async_callers_on_one_thread(running: RunningServer) -> None:
    """Sixty-four tasks on one event loop, each its own LangGraph thread, put checkpoints and
    their writes and read them back at once (their calls overlap); two more race a put and
    the writes pending on it in one thread, and the writes still read back on their
    checkpoint; graphs run with durability="async" side by side."""
    prefix, callers, steps = new_prefix(), 64, 4

    async def caller(saver: SessionlogSaver, n: int) -> list[int]:
        parent = None
        for step in range(steps):
            stored = await saver.aput(
                _step(f"c{n}", parent), empty_checkpoint(), {"step": step}, {}
            )
            parent = str(stored["configurable"]["checkpoint_id"])
            await saver.aput_writes(stored, [("out", f"{n}:{step}")], "task")
            latest = await saver.aget_tuple(_step(f"c{n}", None))
            assert latest is not None
            assert latest.checkpoint["id"] == parent
            assert latest.pending_writes == [("task", "out", f"{n}:{step}")]
        return [t.metadata["step"] async for t in saver.alist(_step(f"c{n}", None))]

    async def racing(saver: SessionlogSaver) -> None:
        first = await saver.aput(_step("race", None), empty_checkpoint(), {"step": 0}, {})
        checkpoint = empty_checkpoint()
        pending = _step("race", checkpoint["id"])
        put = asyncio.ensure_future(saver.aput(first, checkpoint, {"step": 1}, {}))
        await asyncio.sleep(0)  # the put has started: the writes wait for it
        await saver.aput_writes(pending, [("out", "late")], "task")
        await put
        latest = await saver.aget_tuple(_step("race", None))
        assert latest is not None
        assert latest.checkpoint["id"] == checkpoint["id"]
        assert latest.pending_writes == [("task", "out", "late")]

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(NoThreads(max_workers=1))
        client = InFlight(running.address)
        try:
            saver = SessionlogSaver(client, prefix=prefix)
            with pytest.raises(TypeError, match="AsyncClient"):
                saver.get_tuple(_step("c0", None))  # given an AsyncClient: async only
            results = await asyncio.gather(
                *(caller(saver, n) for n in range(callers)), racing(saver)
            )
        finally:
            await client.close()
        assert results[:callers] == [list(range(steps - 1, -1, -1))] * callers
        loop.set_default_executor(ThreadPoolExecutor(max_workers=4))
        async with SessionlogSaver(running.address, prefix=prefix) as graphs:
            graph = build(graphs)

            async def one(n: int) -> list[str]:
                config: RunnableConfig = {"configurable": {"thread_id": f"g{n}"}}
                await graph.ainvoke(START_STATE, config, durability="async")
                out = await graph.ainvoke(Command(resume=f"r{n}"), config, durability="async")
                return list(out["steps"])

            outs = await asyncio.gather(*(one(n) for n in range(8)))
            assert outs == [["plan", "ask", f"act:r{n}"] for n in range(8)]

    NoThreads.submitted = 0
    InFlight.most = 0
    asyncio.run(run())
    assert NoThreads.submitted == 0
    assert InFlight.most > 8, InFlight.most
