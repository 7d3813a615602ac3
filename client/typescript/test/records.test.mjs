// Session records from the Node client: createSession with labels and a parent, updateSession
// (only the fields given change), listSessions with filter and orderBy, children.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { useServer } from "./server.mjs";

describe("session records", () => {
  const live = useServer();

  const ids = async (options) => {
    const out = [];
    for await (const page of live.client.listSessions({ pageSize: 2, ...options })) out.push(...page.sessions.map((s) => s.sessionId));
    return out;
  };

  test("create, update, filter, order and children", async () => {
    const { session: a } = await live.client.createSession("ts.a", [], { title: "A", labels: { team: "core" }, owner: "ana" });
    assert.deepEqual([a.title, a.labels, a.owner, a.parentSeq], ["A", { team: "core" }, "ana", undefined]);
    await live.client.createSession("ts.b", [], { labels: { team: "web" } });
    await live.client.append("ts.a", [{ type: "tool_call", data: { name: "spawn" } }]);
    const { session: kid } = await live.client.createSession("ts.kid", [], { parentSessionId: "ts.a", parentSeq: 0 });
    assert.deepEqual([kid.parentSessionId, kid.parentSeq, kid.eventCount], ["ts.a", 0, 0]);
    const b = await live.client.updateSession("ts.b", { status: "done", setLabels: { env: "prod" }, removeLabels: ["team"] });
    assert.deepEqual([b.status, b.labels], ["done", { env: "prod" }]);
    const a2 = await live.client.updateSession("ts.a", { title: "A2" });
    assert.deepEqual([a2.title, a2.owner, a2.labels], ["A2", "ana", { team: "core" }]);
    assert.ok(a2.updateTime);
    assert.deepEqual(await ids({ prefix: "ts.", filter: 'labels.team = "core"' }), ["ts.a"]);
    assert.deepEqual(await ids({ prefix: "ts.", orderBy: "update_time desc" }), ["ts.a", "ts.b", "ts.kid"]);
    assert.deepEqual((await live.client.children("ts.a")).map((s) => s.sessionId), ["ts.kid"]);
  });

  test("refusals carry the server's reasons", async () => {
    await assert.rejects(live.client.updateSession("ts.none", { title: "x" }), { reason: "SESSION_NOT_FOUND" });
    await assert.rejects(ids({ filter: "nonsense" }), { reason: "INVALID_FILTER" });
    await assert.rejects(live.client.createSession("ts.orphan", [], { parentSessionId: "ts.nobody" }), { reason: "SESSION_NOT_FOUND" });
    await assert.rejects(live.client.updateSession("ts.a", {}), { reason: "MALFORMED_REQUEST" });
  });
});
