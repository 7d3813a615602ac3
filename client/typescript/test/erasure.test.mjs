// deleteSession and redactEvents against a real server.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { useServer } from "./server.mjs";

const user = (content) => ({ type: "user_message", data: { content } });

describe("erasure", () => {
  const live = useServer();

  test("redactEvents keeps the shape and marks the events, deriveMessages shows no content", async () => {
    await live.client.append("ts-red", [user("hello"), user("secret"), user("bye")]);
    const reply = await live.client.redactEvents("ts-red", [1], { reason: "privacy" });
    assert.deepEqual(reply.seqs, [1]);
    assert.ok(reply.position > 0);
    const stored = [];
    for await (const event of live.client.since("ts-red")) stored.push(event);
    assert.deepEqual(stored.map((e) => e.seq), [0, 1, 2]);
    assert.deepEqual(stored[1].data, {});
    assert.equal(stored[1].redacted.reason, "privacy");
    assert.equal(stored[0].redacted, undefined);
    const derived = await live.client.deriveMessages("ts-red");
    assert.deepEqual(derived.messages.map((m) => m.content), ["hello", null, "bye"]);
    assert.deepEqual((await live.client.redactEvents("ts-red", [1])).seqs, []);
    await assert.rejects(live.client.redactEvents("ts-red", [9]), (error) => error.reason === "BOUNDARY_OUT_OF_RANGE");
  });

  test("deleteSession erases the session; a second delete is SESSION_NOT_FOUND", async () => {
    await live.client.append("ts-del", [user("a"), user("b")]);
    await assert.rejects(live.client.deleteSession("ts-del", { expectedSeq: 5 }), (error) => error.reason === "SEQ_CONFLICT");
    const deleted = await live.client.deleteSession("ts-del", { expectedSeq: 2, reason: "test" });
    assert.equal(deleted.eventCount, 2);
    assert.equal(deleted.session.sessionId, "ts-del");
    assert.equal((await live.client.getSession("ts-del")).session.exists, false);
    await assert.rejects(live.client.deleteSession("ts-del"), (error) => error.reason === "SESSION_NOT_FOUND");
  });
});
