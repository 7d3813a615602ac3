// hide, popLast and clear against a real server: EVENT_TYPE_HIDE from the Node client.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { useServer } from "./server.mjs";

const user = (content) => ({ type: "user_message", data: { content } });

describe("hiding from the view", () => {
  const live = useServer();

  test("hide shadows a range, popLast returns the newest message, clear empties the view", async () => {
    await live.client.append("h", [user("a"), user("b"), user("c"), user("d")]);
    const hid = await live.client.hide("h", 1, 1, { reason: "undo" });
    assert.equal(hid.events[0].type, "hide");
    assert.deepEqual(hid.events[0].replace, [1, 1]);
    assert.deepEqual((await live.client.deriveMessages("h")).messages.map((m) => m.content), ["a", "c", "d"]);
    const popped = await live.client.popLast("h");
    assert.equal(popped.seq, 3);
    assert.equal(popped.message.content, "d");
    assert.deepEqual((await live.client.deriveMessages("h", { atSeq: 4 })).messages.map((m) => m.content), ["a", "c", "d"]);
    assert.notEqual(await live.client.clear("h"), undefined);
    assert.deepEqual((await live.client.deriveMessages("h")).messages, []);
    assert.equal(await live.client.popLast("h"), undefined);
    assert.equal(await live.client.clear("never-written"), undefined);
    const stored = [];
    for await (const event of live.client.since("h")) stored.push(event.type);
    assert.deepEqual(stored, ["user_message", "user_message", "user_message", "user_message", "hide", "hide", "hide"]);
  });

  test("concurrent popLast calls each take a different message", async () => {
    await live.client.append("p", [user("0"), user("1"), user("2"), user("3")]);
    const results = await Promise.all([0, 1, 2, 3].map(() => live.client.popLast("p")));
    assert.deepEqual(results.map((r) => r.seq).sort(), [0, 1, 2, 3]);
    assert.equal(await live.client.popLast("p"), undefined);
  });

  test("a hide without a range is refused with INVALID_SURFACE_OP", async () => {
    await assert.rejects(live.client.append("bad", [{ type: "hide" }]), (error) => error.reason === "INVALID_SURFACE_OP");
  });
});
