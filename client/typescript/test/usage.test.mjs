// The usage ledger from the Node client: usage on events, getUsage, and usage on sessions.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { SessionLogClient } from "../src/index.js";
import { startServer } from "./server.mjs";

const answer = (model, inputTokens, outputTokens = 0) => ({
  type: "assistant_message",
  data: { content: "ok" },
  usage: { model, inputTokens, outputTokens },
});

describe("usage ledger", () => {
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

  test("usage on events sums per model; atSeq, a fork's own usage and the tree", async () => {
    const written = await client.append("u", [answer("m", 10, 2), { type: "step_end", usage: { model: "n", inputTokens: 3, cachedInputTokens: 1 } }]);
    assert.deepEqual(written.events[1].usage, { model: "n", inputTokens: 3, outputTokens: 0, cachedInputTokens: 1, reasoningTokens: 0 });
    const whole = await client.getUsage("u");
    assert.equal(whole.eventCount, 2);
    assert.deepEqual(whole.usage, [
      { model: "m", inputTokens: 10, outputTokens: 2, cachedInputTokens: 0, reasoningTokens: 0, eventCount: 1 },
      { model: "n", inputTokens: 3, outputTokens: 0, cachedInputTokens: 1, reasoningTokens: 0, eventCount: 1 },
    ]);
    assert.deepEqual((await client.getUsage("u", { atSeq: 0 })).usage.map((u) => u.model), ["m"]);
    await client.forkSession("u", { sessionId: "u.f", atSeq: 0 });
    await client.append("u.f", [answer("m", 5)]);
    const child = await client.getUsage("u.f");
    assert.equal(child.usage[0].inputTokens, 15);
    assert.equal(child.ownUsage[0].inputTokens, 5);
    const tree = await client.getUsage("u", { includeDescendants: true });
    assert.deepEqual(tree.descendantSessionIds, ["u.f"]);
    assert.equal(tree.usage[0].inputTokens, 15);
  });

  test("getSession and listSessions carry usage; a page sums it", async () => {
    await client.append("l.a", [answer("m", 1)]);
    await client.append("l.b", [answer("m", 2)]);
    assert.equal((await client.getSession("l.b")).session.usage[0].inputTokens, 2);
    const pages = [];
    for await (const page of client.listSessions({ prefix: "l." })) pages.push(page);
    assert.deepEqual(pages[0].sessions.map((s) => s.usage[0].inputTokens), [1, 2]);
    assert.equal(pages[0].usageTotal[0].inputTokens, 3);
    assert.equal(pages[0].usageTotal[0].eventCount, 2);
  });

  test("a usage without a model is refused with INVALID_USAGE", async () => {
    await assert.rejects(
      client.append("bad", [{ type: "step_end", usage: { model: "", inputTokens: 1 } }]),
      (error) => error.reason === "INVALID_USAGE",
    );
  });
});
