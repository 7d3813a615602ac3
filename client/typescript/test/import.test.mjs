// importSession against a real server: a session copied with its seqs and times, in chunks.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { useServer } from "./server.mjs";

const user = (content) => ({ type: "user_message", data: { content } });

describe("importing a session", () => {
  const live = useServer();

  test("events read with since go into another id unchanged, in two chunks", async () => {
    await live.client.append("src", [user("a"), user("b"), user("c")]);
    await live.client.append("src", [{ type: "user_message", data: { content: "sum" }, replace: [0, 1] }]);
    const stored = [];
    for await (const event of live.client.since("src")) stored.push(event);
    const { session: source } = await live.client.getSession("src");
    const first = await live.client.importSession("dst", stored.slice(0, 2), { createTime: source.createTime });
    assert.equal(first.importedCount, 2);
    const rest = await live.client.importSession("dst", stored.slice(2), {
      firstSeq: 2,
      lastAppendTime: source.lastAppendTime,
    });
    assert.equal(rest.session.eventCount, 4);
    const copied = [];
    for await (const event of live.client.since("dst")) copied.push(event);
    assert.deepEqual(copied, stored);
    const { session } = await live.client.getSession("dst");
    assert.equal(session.createTime, source.createTime);
    assert.equal(session.lastAppendTime, source.lastAppendTime);
  });

  test("a chunk not at the next seq is refused with IMPORT_SEQ_MISMATCH", async () => {
    await live.client.importSession("gap", [user("a")], { createTime: "2024-01-01T00:00:00Z" });
    await assert.rejects(
      live.client.importSession("gap", [user("b")], { firstSeq: 3 }),
      (error) => error.reason === "IMPORT_SEQ_MISMATCH" && error.metadata.next_seq === "1",
    );
    await assert.rejects(
      live.client.importSession("src", [user("x")]),
      (error) => error.reason === "SESSION_ALREADY_EXISTS",
    );
  });
});
