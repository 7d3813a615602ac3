// SessionlogSaver (sessionlog-client/langgraph) under real LangGraph.js graphs on a real server:
// invoke, an interrupt and its resume, time travel from an earlier checkpoint, durability
// "async"; a second worker on one thread gets StaleThreadError instead of forking it silently;
// copyThread, prune and deleteThread; thread ids a session id cannot hold. The framework's own
// conformance suite runs apart, under Vitest (test/vitest/langgraph-conformance.test.mjs).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Annotation, Command, END, START, StateGraph, interrupt } from "@langchain/langgraph";
import { emptyCheckpoint, uuid6 } from "@langchain/langgraph-checkpoint";
import { SessionlogSaver, StaleThreadError, sessionIdOf, threadIdOf } from "sessionlog-client/langgraph";

import { useServer } from "./server.mjs";

const WORKERS = Number(process.env.SESSIONLOG_TEST_WORKERS ?? 1);
const SERVE_ARGS = WORKERS >= 2 ? ["--workers", String(WORKERS)] : [];

const State = Annotation.Root({
  steps: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }),
  answer: Annotation(),
});

/** START -> plan -> ask (interrupts for a human answer) -> finish -> END. */
function approvalGraph(checkpointer) {
  return new StateGraph(State)
    .addNode("plan", () => ({ steps: ["plan"] }))
    .addNode("ask", () => ({ steps: ["ask"], answer: interrupt({ question: "go?" }) }))
    .addNode("finish", (state) => ({ steps: [`finish:${state.answer}`] }))
    .addEdge(START, "plan")
    .addEdge("plan", "ask")
    .addEdge("ask", "finish")
    .addEdge("finish", END)
    .compile({ checkpointer });
}

/** START -> count -> END, adding one step per invoke. */
function counterGraph(checkpointer) {
  return new StateGraph(State)
    .addNode("count", (state) => ({ steps: [`n${state.steps.length}`] }))
    .addEdge(START, "count")
    .addEdge("count", END)
    .compile({ checkpointer });
}

let prefixes = 0;

describe("SessionlogSaver under LangGraph.js", () => {
  const live = useServer({ args: SERVE_ARGS });
  const saver = () => new SessionlogSaver(live.client, { prefix: `lgs${process.pid}n${++prefixes}.` });

  test("a graph interrupts, is resumed from the log by a new saver, and finishes", async () => {
    const first = saver();
    const config = { configurable: { thread_id: "approval" } };
    const paused = await approvalGraph(first).invoke({ steps: [] }, config);
    assert.deepEqual(paused.steps, ["plan"]);
    assert.equal(paused.__interrupt__[0].value.question, "go?");

    const second = new SessionlogSaver(live.client, { prefix: first.prefix }); // another process's view
    const graph = approvalGraph(second);
    const state = await graph.getState(config);
    assert.deepEqual(state.next, ["ask"]);
    const done = await graph.invoke(new Command({ resume: "yes" }), config);
    assert.deepEqual(done.steps, ["plan", "ask", "finish:yes"]);
    const stored = await live.client.getSession(sessionIdOf(first.prefix, "approval"));
    assert.ok(stored.session.eventCount >= 6, `checkpoints and writes are events: ${stored.session.eventCount}`);
  });

  test("time travel: invoking from an earlier checkpoint forks the history there", async () => {
    const checkpointer = saver();
    const graph = counterGraph(checkpointer);
    const config = { configurable: { thread_id: "travel" } };
    await graph.invoke({ steps: [] }, config);
    await graph.invoke({ steps: [] }, config);
    await graph.invoke({ steps: [] }, config);
    assert.deepEqual((await graph.getState(config)).values.steps, ["n0", "n1", "n2"]);

    const history = [];
    for await (const snapshot of graph.getStateHistory(config)) history.push(snapshot);
    const afterFirst = history.find((s) => s.values.steps?.length === 1 && s.next.length === 0);
    assert.ok(afterFirst, "the checkpoint after the first invoke is listed");
    const replayed = await graph.invoke({ steps: [] }, afterFirst.config);
    assert.deepEqual(replayed.steps, ["n0", "n1"]);
    assert.deepEqual((await graph.getState(config)).values.steps, ["n0", "n1"], "the latest is now the fork's");
    const older = await graph.getState({ configurable: { ...config.configurable, checkpoint_id: history[0].config.configurable.checkpoint_id } });
    assert.deepEqual(older.values.steps, ["n0", "n1", "n2"], "the abandoned branch stays readable");
  });

  test('durability "async" stores every step, readable once invoke returns', async () => {
    const graph = approvalGraph(saver());
    const config = { configurable: { thread_id: "async-run" } };
    await graph.invoke({ steps: [] }, { ...config, durability: "async" });
    const done = await graph.invoke(new Command({ resume: "ok" }), { ...config, durability: "async" });
    assert.deepEqual(done.steps, ["plan", "ask", "finish:ok"]);
    const snapshot = await graph.getState(config);
    assert.deepEqual(snapshot.values.steps, ["plan", "ask", "finish:ok"]);
    assert.deepEqual(snapshot.next, []);
  });

  test("a second worker that stores a checkpoint behind another's back gets StaleThreadError", async () => {
    const a = saver();
    const b = new SessionlogSaver(live.client, { prefix: a.prefix });
    const thread = { configurable: { thread_id: "two-workers", checkpoint_ns: "" } };
    const meta = { source: "loop", step: 0, parents: {} };
    const first = await a.put(thread, { ...emptyCheckpoint(), id: uuid6(1) }, meta, {});
    assert.ok(await b.getTuple(thread), "b read the thread");
    await a.put(first, { ...emptyCheckpoint(), id: uuid6(1) }, { ...meta, step: 1 }, {});
    await assert.rejects(b.put(first, { ...emptyCheckpoint(), id: uuid6(1) }, { ...meta, step: 1 }, {}), StaleThreadError);
    let count = 0;
    for await (const _ of a.list(thread)) count += 1;
    assert.equal(count, 2, "the stale put stored nothing");

    // pending writes and other namespaces from another worker are not a fork: b retries past them
    const latest = await b.getTuple(thread);
    await a.putWrites(latest.config, [["steps", ["x"]]], "task-1");
    await a.put({ configurable: { thread_id: "two-workers", checkpoint_ns: "sub" } }, { ...emptyCheckpoint(), id: uuid6(1) }, meta, {});
    await b.put(latest.config, { ...emptyCheckpoint(), id: uuid6(1) }, { ...meta, step: 2 }, {});
    assert.equal((await a.getTuple(thread)).metadata.step, 2);
  });

  test("copyThread forks the thread, prune keeps the latest checkpoint, deleteThread deletes", async () => {
    const checkpointer = saver();
    const graph = counterGraph(checkpointer);
    await graph.invoke({ steps: [] }, { configurable: { thread_id: "src" } });
    await graph.invoke({ steps: [] }, { configurable: { thread_id: "src" } });
    await checkpointer.copyThread("src", "copy");
    const list = async (thread_id) => {
      const all = [];
      for await (const tuple of checkpointer.list({ configurable: { thread_id } })) all.push(tuple);
      return all;
    };
    const source = await list("src");
    assert.equal((await list("copy")).length, source.length);
    await graph.invoke({ steps: [] }, { configurable: { thread_id: "copy" } });
    assert.deepEqual((await graph.getState({ configurable: { thread_id: "copy" } })).values.steps, ["n0", "n1", "n2"]);
    assert.deepEqual((await graph.getState({ configurable: { thread_id: "src" } })).values.steps, ["n0", "n1"], "the source is untouched");

    await checkpointer.prune(["copy"]);
    assert.equal((await list("copy")).length, 1);
    assert.deepEqual((await graph.getState({ configurable: { thread_id: "copy" } })).values.steps, ["n0", "n1", "n2"]);
    await checkpointer.deleteThread("copy");
    assert.equal((await list("copy")).length, 0);
    assert.equal((await list("src")).length, source.length);
    await checkpointer.deleteThread("never-written"); // nothing to delete: no error
  });

  test("thread ids a session id cannot hold round-trip through the session id", async () => {
    for (const id of ["a b/c", "naïve-thread", "日本", "x-2d"]) {
      const session = sessionIdOf("lg.", id);
      assert.match(session, /^lg\.[A-Za-z0-9_.-]+$/);
      assert.equal(threadIdOf("lg.", session), id);
    }
    const graph = counterGraph(saver());
    const config = { configurable: { thread_id: "user 42 / chat" } };
    await graph.invoke({ steps: [] }, config);
    assert.deepEqual((await graph.getState(config)).values.steps, ["n0"]);
  });

  test("a put with no thread_id is refused, and so is an unknown prune strategy", async () => {
    const checkpointer = saver();
    await assert.rejects(checkpointer.put({ configurable: {} }, emptyCheckpoint(), { source: "input", step: -1, parents: {} }, {}), /thread_id/);
    await assert.rejects(checkpointer.prune(["t"], { strategy: "all" }), /prune strategy/);
    assert.throws(() => new SessionlogSaver(live.client, { prefix: "-bad" }), /prefix/);
  });
});
