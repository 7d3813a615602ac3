// getState and stateDelta against a real server: the session state from the Node client.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { useServer } from "./server.mjs";

const user = (content, stateDelta) => ({ type: "user_message", data: { content }, stateDelta });

describe("session state", () => {
  const live = useServer();

  test("deltas fold shallowly in seq order; null deletes; atSeq reads a prefix", async () => {
    const reply = await live.client.append("s", [
      user("a", { user: "ann", cart: { apples: 1 } }),
      user("b"),
      user("c", { cart: { pears: 2 }, user: null, step: 3 }),
    ]);
    assert.deepEqual(reply.events[0].stateDelta, { user: "ann", cart: { apples: 1 } });
    assert.equal("stateDelta" in reply.events[1], false);
    assert.deepEqual(await live.client.getState("s"), { state: { cart: { pears: 2 }, step: 3 }, eventCount: 3 });
    assert.deepEqual(await live.client.getState("s", { atSeq: 1 }), {
      state: { user: "ann", cart: { apples: 1 } },
      eventCount: 2,
    });
    const stored = [];
    for await (const event of live.client.since("s")) stored.push(event.stateDelta ?? null);
    assert.deepEqual(stored, [{ user: "ann", cart: { apples: 1 } }, null, { cart: { pears: 2 }, user: null, step: 3 }]);
  });

  test("a session never written has the empty state; a boundary past the end is refused", async () => {
    assert.deepEqual(await live.client.getState("never-written"), { state: {}, eventCount: 0 });
    await live.client.append("short", [user("only", { n: 1 })]);
    await assert.rejects(live.client.getState("short", { atSeq: 5 }), (error) => error.reason === "BOUNDARY_OUT_OF_RANGE");
  });

  test("listSessions with view full carries each session's state; the default view none", async () => {
    await live.client.append("lv.a", [user("a", { n: 1, who: "ann" }), user("b", { n: 2 })]);
    await live.client.append("lv.b", [user("c")]);
    const full = [];
    for await (const page of live.client.listSessions({ prefix: "lv.", view: "full" })) full.push(...page.sessions);
    assert.deepEqual(
      full.map((s) => [s.sessionId, s.state]),
      [
        ["lv.a", { n: 2, who: "ann" }],
        ["lv.b", {}],
      ],
    );
    const basic = [];
    for await (const page of live.client.listSessions({ prefix: "lv." })) basic.push(...page.sessions);
    assert.deepEqual(
      basic.map((s) => "state" in s),
      [false, false],
    );
  });
});
