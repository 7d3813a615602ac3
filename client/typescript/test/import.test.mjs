// importSession against a real server: a session copied with its seqs and times, in chunks.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { SessionLogClient } from "../src/index.js";
import { startServer } from "./server.mjs";

const user = (content) => ({ type: "user_message", data: { content } });

describe("importing a session", () => {
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

  test("events read with since go into another id unchanged, in two chunks", async () => {
    await client.append("src", [user("a"), user("b"), user("c")]);
    await client.append("src", [{ type: "user_message", data: { content: "sum" }, replace: [0, 1] }]);
    const stored = [];
    for await (const event of client.since("src")) stored.push(event);
    const { session: source } = await client.getSession("src");
    const first = await client.importSession("dst", stored.slice(0, 2), { createTime: source.createTime });
    assert.equal(first.importedCount, 2);
    const rest = await client.importSession("dst", stored.slice(2), {
      firstSeq: 2,
      lastAppendTime: source.lastAppendTime,
    });
    assert.equal(rest.session.eventCount, 4);
    const copied = [];
    for await (const event of client.since("dst")) copied.push(event);
    assert.deepEqual(copied, stored);
    const { session } = await client.getSession("dst");
    assert.equal(session.createTime, source.createTime);
    assert.equal(session.lastAppendTime, source.lastAppendTime);
  });

  test("a chunk not at the next seq is refused with IMPORT_SEQ_MISMATCH", async () => {
    await client.importSession("gap", [user("a")], { createTime: "2024-01-01T00:00:00Z" });
    await assert.rejects(
      client.importSession("gap", [user("b")], { firstSeq: 3 }),
      (error) => error.reason === "IMPORT_SEQ_MISMATCH" && error.metadata.next_seq === "1",
    );
    await assert.rejects(
      client.importSession("src", [user("x")]),
      (error) => error.reason === "SESSION_ALREADY_EXISTS",
    );
  });
});
