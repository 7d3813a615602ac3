// followSessions against real servers: a prefix and a label filter, follow false ending when
// caught up, a deletion marker, a bad filter, a resume across a server restart, and one refused
// on a server restored from an older backup.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { test } from "node:test";

import { SessionLogClient } from "sessionlog-client";
import { SESSIONLOG_BIN, freePort, startServer, tempDir } from "./server.mjs";

const user = (content) => ({ type: "user_message", data: { content } });
const FAST = { giveUpAfterMs: 20_000, initialBackoffMs: 20, maxBackoffMs: 200 };

async function take(stream, count) {
  const got = [];
  for await (const change of stream) {
    got.push(change);
    if (got.length === count) break;
  }
  return got;
}

test("followSessions keeps a prefix's and a filter's sessions, marks deletes, ends when caught up", async () => {
  const server = await startServer();
  const client = new SessionLogClient(server.address);
  try {
    await client.createSession("fs.core", [], { labels: { team: "core" } });
    await client.append("fs.core", [user("c0"), user("c1")]);
    await client.append("other.x", [user("x")]);
    await client.append("fs.web", [user("w0")]);
    await client.deleteSession("fs.web");
    const all = [];
    for await (const change of client.followSessions({ prefix: "fs.", after: 0, follow: false })) all.push(change);
    assert.deepEqual(
      all.map((c) => [c.sessionId, c.events.map((e) => e.data.content), c.deleted]),
      [["fs.core", ["c0", "c1"], false], ["fs.web", [], true]],
    );
    const core = [];
    const filtered = client.followSessions({ filter: 'labels.team = "core"', after: 0, follow: false });
    for await (const change of filtered) core.push([change.sessionId, change.deleted]);
    // A deletion is sent whatever the filter: the deleted session's record is gone.
    assert.deepEqual(core, [["fs.core", false], ["fs.web", true]]);
    assert.ok(filtered.caughtUp);
    const bad = client.followSessions({ filter: "labels.team ~ x" });
    await assert.rejects(take(bad, 1), (error) => error.reason === "INVALID_FILTER");
  } finally {
    client.close();
    await server.stop();
    server.remove();
  }
});

test("followSessions resumes after its last position across a server restart", async () => {
  const root = tempDir();
  let server = await startServer({ root });
  const { port } = server;
  const client = new SessionLogClient(server.address, { retry: FAST });
  try {
    await client.append("rs.a", [user("0")]);
    const stream = client.followSessions({ prefix: "rs.", after: 0 });
    const iterator = stream[Symbol.asyncIterator]();
    const first = (await iterator.next()).value;
    assert.equal(first.sessionId, "rs.a");
    assert.equal(await server.stop(), 0);
    server = await startServer({ root, port });
    await client.append("rs.b", [user("1")]);
    await client.append("rs.a", [user("2")]);
    const next = [(await iterator.next()).value, (await iterator.next()).value];
    assert.deepEqual(next.map((c) => [c.sessionId, c.events[0].seq]), [["rs.b", 0], ["rs.a", 1]]);
    assert.ok(next[0].position > first.position);
    assert.ok(stream.reconnects >= 1);
    assert.equal(stream.position, next[1].position);
    stream.close();
  } finally {
    client.close();
    await server.stop();
    server.remove();
  }
});

function admin(...args) {
  const env = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("SESSIONLOG_")));
  const done = spawnSync(SESSIONLOG_BIN, ["admin", ...args], { env, encoding: "utf8" });
  assert.equal(done.status, 0, done.stderr);
}

test("followSessions fails with HISTORY_DIVERGED on a server restored from an older backup", async () => {
  const root = tempDir();
  const data = join(root, "data");
  const backup = join(root, "backup");
  let server = await startServer({ root });
  const { port } = server;
  const client = new SessionLogClient(server.address, { retry: FAST });
  try {
    await client.append("rb.a", [user("0")]);
    admin("backup", backup, "--data", data);
    await client.append("rb.a", [user("1")]);
    await client.append("rb.a", [user("2")]);
    const stream = client.followSessions({ prefix: "rb.", after: 0 });
    const iterator = stream[Symbol.asyncIterator]();
    for (let i = 0; i < 3; i++) await iterator.next();
    assert.ok(stream.position > 0);
    assert.ok(stream.checksum.length > 0);
    assert.equal(await server.stop(), 0);
    admin("restore", backup, "--data", data, "--force");
    // The new history runs past position 3 on another port, before the stream can reconnect.
    server = await startServer({ root, port: await freePort() });
    const elsewhere = new SessionLogClient(server.address);
    for (let i = 0; i < 4; i++) await elsewhere.append("rb.b", [user(`b${i}`)]);
    elsewhere.close();
    assert.equal(await server.stop(), 0);
    server = await startServer({ root, port });
    await assert.rejects(iterator.next(), (error) => error.reason === "HISTORY_DIVERGED");
  } finally {
    client.close();
    await server.stop();
    server.remove();
  }
});
