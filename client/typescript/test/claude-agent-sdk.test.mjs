// SessionlogSessionStore (sessionlog-client/claude-agent-sdk) against a real server. The npm SDK
// ships no conformance harness (and is not a dependency: it pulls a native CLI per platform), so
// its contracts are restated here, one test each, as the Python SDK's
// run_session_store_conformance states them; then a retried batch stored once, subagent
// transcripts erased with their session, stale summaries, and the Python store reading what this
// one wrote.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { describe, test } from "node:test";
import { promisify } from "node:util";

import { SessionLogClient } from "sessionlog-client";
import { SessionlogSessionStore, eventOfEntry, requestIdOf } from "sessionlog-client/claude-agent-sdk";

import { SESSIONLOG_BIN, useServer } from "./server.mjs";

const PYTHON = join(dirname(SESSIONLOG_BIN), "python");
const WORKERS = Number(process.env.SESSIONLOG_TEST_WORKERS ?? 1);
const SERVE_ARGS = WORKERS >= 2 ? ["--workers", String(WORKERS)] : [];

/** A stand-in for the SDK's foldSessionSummary: set-once and last-wins fields, opaque to the store. */
function fold(prev, key, entries) {
  const data = { ...(prev?.data ?? {}) };
  for (const entry of entries) {
    if (data.createdAt === undefined && typeof entry.timestamp === "string") data.createdAt = Date.parse(entry.timestamp);
    if (typeof entry.customTitle === "string") data.customTitle = entry.customTitle;
  }
  return { sessionId: prev?.sessionId ?? key.sessionId, mtime: prev?.mtime ?? 0, data };
}

const e = (fields) => ({ type: "x", ...fields });
const KEY = { projectKey: "proj", sessionId: "sess" };
const SUB1 = { ...KEY, subpath: "subagents/agent-1" };
const SUB2 = { ...KEY, subpath: "subagents/agent-2" };
let stores = 0;

describe("SessionlogSessionStore, the SDK's SessionStore contracts", () => {
  const live = useServer({ args: SERVE_ARGS });
  /** A store of its own (a fresh prefix), as the harness makes one per contract. */
  const fresh = () =>
    new SessionlogSessionStore(live.client, { prefix: `ts${stores++}-${process.pid}.`, foldSessionSummary: fold });

  test("1. append then load returns the entries in order", async () => {
    const store = fresh();
    await store.append(KEY, [e({ uuid: "b", n: 1 }), e({ uuid: "a", n: 2 })]);
    assert.deepEqual(await store.load(KEY), [e({ uuid: "b", n: 1 }), e({ uuid: "a", n: 2 })]);
  });

  test("2. an unknown key loads as null", async () => {
    const store = fresh();
    assert.equal(await store.load({ projectKey: "proj", sessionId: "nope" }), null);
    await store.append(KEY, [e({ uuid: "x", n: 1 })]);
    assert.equal(await store.load({ ...KEY, subpath: "nope" }), null);
  });

  test("3. appends keep call order; 4. append([]) is a no-op", async () => {
    const store = fresh();
    await store.append(KEY, [e({ uuid: "z", n: 1 })]);
    await store.append(KEY, [e({ uuid: "a", n: 2 }), e({ uuid: "m", n: 3 })]);
    await store.append(KEY, []);
    await store.append(KEY, [e({ uuid: "b", n: 4 })]);
    assert.deepEqual(
      (await store.load(KEY)).map((x) => x.n),
      [1, 2, 3, 4],
    );
  });

  test("5. subpaths are stored apart from the main transcript; 6. projects are isolated", async () => {
    const store = fresh();
    await store.append(KEY, [e({ uuid: "m", n: 1 })]);
    await store.append(SUB1, [e({ uuid: "s", n: 1 })]);
    assert.deepEqual(await store.load(KEY), [e({ uuid: "m", n: 1 })]);
    assert.deepEqual(await store.load(SUB1), [e({ uuid: "s", n: 1 })]);
    await store.append({ projectKey: "A", sessionId: "s1" }, [e({ from: "A" })]);
    await store.append({ projectKey: "B", sessionId: "s1" }, [e({ from: "B" })]);
    assert.deepEqual(await store.load({ projectKey: "A", sessionId: "s1" }), [e({ from: "A" })]);
    assert.deepEqual(await store.load({ projectKey: "B", sessionId: "s1" }), [e({ from: "B" })]);
    assert.equal((await store.listSessions("A")).length, 1);
  });

  test("7. listSessions names a project's sessions with epoch-ms mtimes; 8. not subagents", async () => {
    const store = fresh();
    await store.append({ projectKey: "proj", sessionId: "a" }, [e({ n: 1 })]);
    await store.append({ projectKey: "proj", sessionId: "b" }, [e({ n: 1 })]);
    await store.append({ projectKey: "other", sessionId: "c" }, [e({ n: 1 })]);
    await store.append({ projectKey: "proj", sessionId: "a", subpath: "subagents/agent-1" }, [e({ n: 1 })]);
    const sessions = await store.listSessions("proj");
    assert.deepEqual(sessions.map((s) => s.sessionId).sort(), ["a", "b"]);
    assert.ok(sessions.every((s) => Number.isInteger(s.mtime) && s.mtime > 1e12));
    assert.deepEqual(await store.listSessions("never-appended-project"), []);
  });

  test("14. summaries are the fold's output, fresh, untouched by subagents, gone on delete", async () => {
    const store = fresh();
    const key = { projectKey: "proj", sessionId: "summ-sess" };
    await store.append(key, [
      e({ timestamp: "2024-01-01T00:00:00.000Z", customTitle: "first" }),
      e({ timestamp: "2024-01-01T00:00:01.000Z" }),
    ]);
    await store.append(key, [e({ timestamp: "2024-01-01T00:00:02.000Z", customTitle: "second" })]);
    await store.append({ projectKey: "other", sessionId: "elsewhere" }, [e({ timestamp: "2024-01-01T00:00:00.000Z" })]);
    const [summary, ...rest] = await store.listSessionSummaries("proj");
    assert.deepEqual(rest, []);
    assert.equal(summary.sessionId, "summ-sess");
    assert.deepEqual(summary.data, { createdAt: Date.parse("2024-01-01T00:00:00.000Z"), customTitle: "second" });
    const [listed] = await store.listSessions("proj");
    assert.ok(summary.mtime >= listed.mtime && summary.mtime > 1e12);
    await store.append({ ...key, subpath: "subagents/agent-1" }, [e({ customTitle: "subagent" })]);
    assert.deepEqual((await store.listSessionSummaries("proj"))[0].data, summary.data);
    assert.deepEqual(await store.listSessionSummaries("never-appended-project"), []);
    await store.delete(key);
    assert.deepEqual(await store.listSessionSummaries("proj"), []);
  });

  test("9. delete then load is null; 10. delete cascades to subkeys only", async () => {
    const store = fresh();
    await store.delete({ projectKey: "proj", sessionId: "never-written" });
    const other = { projectKey: "proj", sessionId: "sess2" };
    const otherProject = { projectKey: "other-proj", sessionId: KEY.sessionId };
    for (const key of [KEY, SUB1, SUB2, other, otherProject]) await store.append(key, [e({ n: 1 })]);
    await store.delete(KEY);
    for (const key of [KEY, SUB1, SUB2]) assert.equal(await store.load(key), null);
    assert.equal((await store.load(other)).length, 1);
    assert.equal((await store.load(otherProject)).length, 1);
    assert.deepEqual(await store.listSubkeys(KEY), []);
    assert.ok(!(await store.listSessions("proj")).some((s) => s.sessionId === KEY.sessionId));
    for (const logId of [store.sessionLogId(KEY), store.sessionLogId(SUB1)]) {
      assert.equal((await live.client.getSession(logId)).session.exists, false);
    }
  });

  test("11. delete of a subpath removes only it; 12, 13. listSubkeys", async () => {
    const store = fresh();
    await store.append(SUB1, [e({ n: 1 })]); // a subagent first: the main session is made for it
    await store.append(KEY, [e({ n: 1 })]);
    await store.append(SUB2, [e({ n: 1 })]);
    await store.append({ ...KEY, sessionId: "other-sess", subpath: "subagents/agent-x" }, [e({ n: 1 })]);
    assert.deepEqual((await store.listSubkeys(KEY)).sort(), ["subagents/agent-1", "subagents/agent-2"]);
    await store.delete(SUB1);
    assert.equal(await store.load(SUB1), null);
    assert.equal((await store.load(SUB2)).length, 1);
    assert.equal((await store.load(KEY)).length, 1);
    assert.deepEqual(await store.listSubkeys(KEY), ["subagents/agent-2"]);
    assert.deepEqual(await store.listSubkeys({ projectKey: "proj", sessionId: "never-appended" }), []);
  });

  test("a retried batch (the same uuids) is stored once; entries without uuids each time", async () => {
    const store = fresh();
    const batch = [e({ uuid: "u1", n: 1 }), e({ uuid: "u2", n: 2 })];
    await store.append(KEY, batch);
    await store.append(KEY, batch);
    const tag = { type: "tag", tag: "t" };
    await store.append(KEY, [tag]);
    await store.append(KEY, [tag]);
    assert.deepEqual(await store.load(KEY), [...batch, tag, tag]);
    assert.equal((await live.client.getSession(store.sessionLogId(KEY))).session.eventCount, 4);
    assert.equal(requestIdOf([tag]), undefined);
  });

  test("a summary another writer outran reads older than its session, and is re-folded", async () => {
    const store = fresh();
    await store.append(KEY, [e({ uuid: "1", customTitle: "one" })]);
    const logId = store.sessionLogId(KEY);
    const { title } = (await live.client.getSession(logId)).session;
    await store.append(KEY, [e({ uuid: "2", customTitle: "two" })]);
    await live.client.updateSession(logId, { title }); // as if the second update were lost
    const [stale] = await store.listSessionSummaries("proj");
    const [listed] = await store.listSessions("proj");
    assert.ok(stale.mtime < listed.mtime);
    await store.append(KEY, [e({ uuid: "3" })]);
    const [summary] = await store.listSessionSummaries("proj");
    assert.equal(summary.data.customTitle, "two");
    assert.equal(summary.mtime, (await store.listSessions("proj"))[0].mtime);
  });

  test("an append is one Append (entries and summary in one commit); the title is read when another writer appended", async () => {
    const prefix = `ts${stores++}-${process.pid}.`;
    const client = new SessionLogClient(live.server.address);
    const calls = [];
    const send = client._call.bind(client);
    client._call = (method, ...rest) => {
      calls.push(method);
      return send(method, ...rest);
    };
    const store = new SessionlogSessionStore(client, { prefix, foldSessionSummary: fold });
    const other = new SessionlogSessionStore(live.client, { prefix, foldSessionSummary: fold });
    const key = { projectKey: "proj", sessionId: "remembered" };
    try {
      await store.append(key, [e({ uuid: "1", timestamp: "2024-01-01T00:00:00.000Z", customTitle: "one" })]);
      calls.length = 0;
      await store.append(key, [e({ uuid: "2", customTitle: "two" })]);
      assert.deepEqual(calls, ["Append"], "one call, no GetSession after its own summary");
      await other.append(key, [e({ uuid: "3", customTitle: "three" })]); // another writer, its own summary
      calls.length = 0;
      await store.append(key, [e({ uuid: "4" })]);
      assert.deepEqual(calls, ["Append", "GetSession", "Append"], "refused, the title read back");
      const [summary] = await store.listSessionSummaries("proj");
      assert.deepEqual(summary.data, { createdAt: Date.parse("2024-01-01T00:00:00.000Z"), customTitle: "three" });
      assert.equal(JSON.parse((await client.getSession(store.sessionLogId(key))).session.title).n, 4);
      calls.length = 0;
      await store.append(key, [e({ uuid: "5", customTitle: "five" })]);
      assert.deepEqual(calls, ["Append"]);
      assert.equal((await store.listSessionSummaries("proj"))[0].data.customTitle, "five");
    } finally {
      client.close();
    }
  });

  test("a store's first append to a new session is one Append; to one holding events, refused, read, appended", async () => {
    const prefix = `ts${stores++}-${process.pid}.`;
    /** A client that records the names of its unary calls. */
    const counted = () => {
      const client = new SessionLogClient(live.server.address);
      client.calls = [];
      const send = client._call.bind(client);
      client._call = (method, ...rest) => {
        client.calls.push(method);
        return send(method, ...rest);
      };
      return client;
    };
    const [first, second] = [counted(), counted()];
    const key = { projectKey: "proj", sessionId: "first-append" };
    try {
      const store = new SessionlogSessionStore(first, { prefix, foldSessionSummary: fold });
      await store.append(key, [e({ uuid: "1", timestamp: "2024-01-01T00:00:00.000Z", customTitle: "one" })]);
      assert.deepEqual(first.calls, ["Append"], "a new session: no GetSession");
      const resumed = new SessionlogSessionStore(second, { prefix, foldSessionSummary: fold });
      await resumed.append(key, [e({ uuid: "2" })]);
      assert.deepEqual(second.calls, ["Append", "GetSession", "Append"], "a session holding events: refused, then read");
      const [summary] = await resumed.listSessionSummaries("proj");
      assert.deepEqual(summary.data, { createdAt: Date.parse("2024-01-01T00:00:00.000Z"), customTitle: "one" });
      const { session } = await live.client.getSession(resumed.sessionLogId(key));
      assert.equal(session.eventCount, 2);
      assert.equal(JSON.parse(session.title).n, 2);
    } finally {
      first.close();
      second.close();
    }
  });

  test("a session deleted and made again to the same length is folded anew, not onto the old summary", async () => {
    const store = fresh();
    const other = new SessionlogSessionStore(live.client, { prefix: store.prefix, foldSessionSummary: fold });
    await store.append(KEY, [e({ uuid: "1", customTitle: "old" })]);
    await other.delete(KEY);
    await other.append(KEY, [e({ uuid: "2", timestamp: "2024-01-01T00:00:00.000Z" })]);
    await store.append(KEY, [e({ uuid: "3" })]);
    const [summary] = await store.listSessionSummaries("proj");
    assert.deepEqual(summary.data, { createdAt: Date.parse("2024-01-01T00:00:00.000Z") });
  });

  test("a session the two-call store wrote (Append, then UpdateSession) loads, lists and takes appends", async () => {
    const store = fresh();
    const logId = store.sessionLogId(KEY);
    const old = [e({ uuid: "1", customTitle: "kept" }), e({ uuid: "2" })];
    const reply = await live.client.append(logId, old.map(eventOfEntry));
    const title = JSON.stringify({ n: reply.nextSeq, data: fold(undefined, KEY, old).data });
    await live.client.updateSession(logId, { title });
    assert.deepEqual(await store.load(KEY), old);
    assert.equal((await store.listSessionSummaries("proj"))[0].data.customTitle, "kept");
    await store.append(KEY, [e({ uuid: "3", customTitle: "new" })]);
    const [summary] = await store.listSessionSummaries("proj");
    const [listed] = await store.listSessions("proj");
    assert.equal(summary.data.customTitle, "new");
    assert.equal(summary.mtime, listed.mtime);
    assert.equal(JSON.parse((await live.client.getSession(logId)).session.title).n, 3);
  });

  test("without the SDK's fold there is no listSessionSummaries (the SDK loads instead)", () => {
    assert.equal(new SessionlogSessionStore(live.client).listSessionSummaries, undefined);
  });

  test("entries project as the conversation", async () => {
    const store = fresh();
    await store.append(KEY, [
      { type: "user", uuid: "u", message: { role: "user", content: "read a" } },
      { type: "assistant", uuid: "a", message: { content: [{ type: "tool_use", id: "t1", name: "Read", input: {} }] } },
      { type: "user", uuid: "r", message: { content: [{ type: "tool_result", tool_use_id: "t1", content: "text" }] } },
    ]);
    const { messages } = await live.client.deriveMessages(store.sessionLogId(KEY));
    assert.deepEqual(
      messages.map((m) => m.role),
      ["user", "assistant", "tool"],
    );
    assert.equal(eventOfEntry({ type: "summary" }).type, "step_end");
  });

  test("the Python store reads what this one wrote, subagents included", async () => {
    const store = fresh();
    const entries = [{ type: "user", uuid: "u1", message: { role: "user", content: "hé" }, big: 1.5 }];
    await store.append(KEY, entries);
    await store.append(SUB1, [e({ n: 1 })]);
    const script = `
import asyncio, json, sys
from sessionlog_client import AsyncClient
from sessionlog_client.claude_agent_sdk import SessionlogSessionStore
async def main():
    async with AsyncClient(sys.argv[1]) as client:
        store = SessionlogSessionStore(client, prefix=sys.argv[2])
        key = {"project_key": "proj", "session_id": "sess"}
        print(json.dumps([await store.load(key), await store.list_subkeys(key)]))
asyncio.run(main())
`;
    const { stdout } = await promisify(execFile)(PYTHON, ["-c", script, live.server.address, store.prefix]);
    assert.deepEqual(JSON.parse(stdout), [entries, ["subagents/agent-1"]]);
  });
});
