// Session records from the Node client: createSession with labels and a parent, updateSession
// (only the fields given change), listSessions with filter and orderBy, children.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { SessionLogClient } from "../src/index.js";
import { startServer } from "./server.mjs";

describe("session records", () => {
  let server;
  let client;

  before(async () => {
    server = await startServer();
    client = new SessionLogClient(server.address);
  });

  after(async () => {
    client?.close();
    await server?.stop();
    server?.remove();
  });

  const ids = async (options) => {
    const out = [];
    for await (const page of client.listSessions({ pageSize: 2, ...options })) out.push(...page.sessions.map((s) => s.sessionId));
    return out;
  };

  test("create, update, filter, order and children", async () => {
    const { session: a } = await client.createSession("ts.a", [], { title: "A", labels: { team: "core" }, owner: "ana" });
    assert.deepEqual([a.title, a.labels, a.owner, a.parentSeq], ["A", { team: "core" }, "ana", undefined]);
    await client.createSession("ts.b", [], { labels: { team: "web" } });
    await client.append("ts.a", [{ type: "tool_call", data: { name: "spawn" } }]);
    const { session: kid } = await client.createSession("ts.kid", [], { parentSessionId: "ts.a", parentSeq: 0 });
    assert.deepEqual([kid.parentSessionId, kid.parentSeq, kid.eventCount], ["ts.a", 0, 0]);
    const b = await client.updateSession("ts.b", { status: "done", setLabels: { env: "prod" }, removeLabels: ["team"] });
    assert.deepEqual([b.status, b.labels], ["done", { env: "prod" }]);
    const a2 = await client.updateSession("ts.a", { title: "A2" });
    assert.deepEqual([a2.title, a2.owner, a2.labels], ["A2", "ana", { team: "core" }]);
    assert.ok(a2.updateTime);
    assert.deepEqual(await ids({ prefix: "ts.", filter: 'labels.team = "core"' }), ["ts.a"]);
    assert.deepEqual(await ids({ prefix: "ts.", orderBy: "update_time desc" }), ["ts.a", "ts.b", "ts.kid"]);
    assert.deepEqual((await client.children("ts.a")).map((s) => s.sessionId), ["ts.kid"]);
  });

  test("refusals carry the server's reasons", async () => {
    await assert.rejects(client.updateSession("ts.none", { title: "x" }), { reason: "SESSION_NOT_FOUND" });
    await assert.rejects(ids({ filter: "nonsense" }), { reason: "INVALID_FILTER" });
    await assert.rejects(client.createSession("ts.orphan", [], { parentSessionId: "ts.nobody" }), { reason: "SESSION_NOT_FOUND" });
    await assert.rejects(client.updateSession("ts.a", {}), TypeError);
  });
});
