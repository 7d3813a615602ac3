// The usage ledger from the Node client: usage on events, getUsage, and usage on sessions.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { useServer } from "./server.mjs";

const answer = (model, inputTokens, outputTokens = 0) => ({
  type: "assistant_message",
  data: { content: "ok" },
  usage: { model, inputTokens, outputTokens },
});

describe("usage ledger", () => {
  const live = useServer();

  test("usage on events sums per model; atSeq, a fork's own usage and the tree", async () => {
    const written = await live.client.append("u", [answer("m", 10, 2), { type: "step_end", usage: { model: "n", inputTokens: 3, cachedInputTokens: 1 } }]);
    assert.deepEqual(written.events[1].usage, { model: "n", inputTokens: 3, outputTokens: 0, cachedInputTokens: 1, reasoningTokens: 0 });
    const whole = await live.client.getUsage("u");
    assert.equal(whole.eventCount, 2);
    assert.deepEqual(whole.usage, [
      { model: "m", inputTokens: 10, outputTokens: 2, cachedInputTokens: 0, reasoningTokens: 0, eventCount: 1 },
      { model: "n", inputTokens: 3, outputTokens: 0, cachedInputTokens: 1, reasoningTokens: 0, eventCount: 1 },
    ]);
    assert.deepEqual((await live.client.getUsage("u", { atSeq: 0 })).usage.map((u) => u.model), ["m"]);
    await live.client.forkSession("u", { sessionId: "u.f", atSeq: 0 });
    await live.client.append("u.f", [answer("m", 5)]);
    const child = await live.client.getUsage("u.f");
    assert.equal(child.usage[0].inputTokens, 15);
    assert.equal(child.ownUsage[0].inputTokens, 5);
    const tree = await live.client.getUsage("u", { includeDescendants: true });
    assert.deepEqual(tree.descendantSessionIds, ["u.f"]);
    assert.equal(tree.usage[0].inputTokens, 15);
  });

  test("getSession and listSessions carry usage; a page sums it", async () => {
    await live.client.append("l.a", [answer("m", 1)]);
    await live.client.append("l.b", [answer("m", 2)]);
    assert.equal((await live.client.getSession("l.b")).session.usage[0].inputTokens, 2);
    const pages = [];
    for await (const page of live.client.listSessions({ prefix: "l." })) pages.push(page);
    assert.deepEqual(pages[0].sessions.map((s) => s.usage[0].inputTokens), [1, 2]);
    assert.equal(pages[0].usageTotal[0].inputTokens, 3);
    assert.equal(pages[0].usageTotal[0].eventCount, 2);
  });

  test("a usage without a model is refused with INVALID_USAGE", async () => {
    await assert.rejects(
      live.client.append("bad", [{ type: "step_end", usage: { model: "", inputTokens: 1 } }]),
      (error) => error.reason === "INVALID_USAGE",
    );
  });
});
