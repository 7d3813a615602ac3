// SessionlogSession (the OpenAI Agents SDK's Session) against a real server: items round-trip, the
// SDK's session scenarios, DeriveMessages agreeing after pops, the Python backend reading what this
// one wrote and the reverse, and a run() of an Agent with a fake model.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { describe, test } from "node:test";
import { promisify } from "node:util";

import { Agent, protocol, run, setTracingDisabled, tool, Usage } from "@openai/agents";
import { SessionLogClient } from "sessionlog-client";
import { itemType, knownFrom, SessionlogSession } from "sessionlog-client/openai-agents";
import { z } from "zod";

import { SESSIONLOG_BIN, startServer, tempDir, useServer } from "./server.mjs";

setTracingDisabled(true); // no exporter, no network

const PYTHON = join(dirname(SESSIONLOG_BIN), "python");
/** `make test-workers` runs this suite too (SESSIONLOG_TEST_WORKERS=2): then the server has workers. */
const WORKERS = Number(process.env.SESSIONLOG_TEST_WORKERS ?? 1);
const SERVE_ARGS = WORKERS >= 2 ? ["--workers", String(WORKERS)] : [];
const user = (content) => ({ role: "user", content });
const assistant = (text, id = "msg_a") => ({
  type: "message",
  role: "assistant",
  id,
  status: "completed",
  content: [{ type: "output_text", text }],
});

/** One item of every type the SDK's protocol defines, and one it does not. */
const EVERY_ITEM = [
  { role: "system", content: "Be brief." },
  { type: "message", role: "user", content: "plain text" },
  {
    role: "user",
    content: [
      { type: "input_text", text: "look at" },
      { type: "input_image", image: "https://example.com/cat.png", detail: "low" },
      { type: "input_file", file: { id: "file_1" }, filename: "notes.txt" },
    ],
    providerData: { weight: 1.5, big: 9007199254740991, nested: { list: [1, null, "x", true] } },
  },
  {
    type: "message",
    role: "assistant",
    id: "msg_1",
    status: "completed",
    content: [
      { type: "output_text", text: "Here", providerData: { annotations: [] } },
      { type: "refusal", refusal: "not that" },
    ],
  },
  { type: "reasoning", id: "rs_1", content: [{ type: "input_text", text: "thinking" }], providerData: { encrypted: "e0" } },
  { type: "function_call", id: "fc_1", callId: "call_1", name: "weather", arguments: '{"city":"Oslo"}', status: "completed" },
  { type: "function_call_result", callId: "call_1", name: "weather", status: "completed", output: { type: "text", text: "rain" } },
  {
    type: "function_call_result",
    callId: "call_2",
    name: "photo",
    status: "completed",
    output: [{ type: "input_text", text: "a photo" }, { type: "input_image", image: "https://example.com/p.png" }],
  },
  { type: "hosted_tool_call", id: "ht_1", name: "web_search", arguments: "{}", status: "completed", output: "found" },
  { type: "computer_call", id: "cc_1", callId: "call_3", status: "completed", action: { type: "click", x: 1, y: 2, button: "left" } },
  { type: "computer_call_result", callId: "call_3", output: { type: "computer_screenshot", data: "iVBOR" } },
  { type: "shell_call", callId: "call_4", status: "completed", action: { commands: ["ls"], timeoutMs: 1000 } },
  {
    type: "shell_call_output",
    callId: "call_4",
    output: [{ stdout: "a.txt\n", stderr: "", outcome: { type: "exit", exitCode: 0 } }],
  },
  { type: "apply_patch_call", callId: "call_5", status: "completed", operation: { type: "delete_file", path: "a.txt" } },
  { type: "apply_patch_call_output", callId: "call_5", status: "completed", output: "deleted" },
  { type: "tool_search_call", id: "ts_1", callId: "call_6", execution: "server", arguments: { query: "weather" } },
  { type: "tool_search_output", callId: "call_6", execution: "server", tools: [{ type: "function", name: "weather" }] },
  { type: "program", id: "pg_1", callId: "call_7", code: "print(1)", fingerprint: "f1" },
  { type: "program_output", callId: "call_7", output: "1", status: "completed" },
  { type: "compaction", encrypted_content: "opaque" },
  { type: "unknown", id: "u_1", providerData: { whatever: [1, 2] } },
  { type: "a_type_from_the_future", payload: { deep: [[[{ x: 0.1 }]]], empty: {} } },
];
const FUTURE = EVERY_ITEM.at(-1);

/** A small seeded PRNG (mulberry32): the random logs are the same on every run. */
function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The item types the SDK's protocol (its ModelItem union) defines: "message" for role messages. */
function protocolItemTypes() {
  const types = new Set();
  const walk = (schema) => {
    if (schema.options) return schema.options.forEach(walk);
    const type = schema.shape.type;
    types.add(type.value ?? type.unwrap().value);
  };
  walk(protocol.ModelItem);
  return types;
}

describe("SessionlogSession (OpenAI Agents SDK)", () => {
  const live = useServer({ args: SERVE_ARGS });
  const session = (id) => new SessionlogSession(id, live.client);

  test("the samples cover every item type the SDK defines, each valid for the SDK", () => {
    const sampled = new Set(EVERY_ITEM.filter((i) => i !== FUTURE).map(itemType));
    assert.deepEqual([...sampled].sort(), [...protocolItemTypes()].sort());
    for (const item of EVERY_ITEM.filter((i) => i !== FUTURE)) {
      const parsed = protocol.ModelItem.safeParse(item);
      assert.ok(parsed.success, `${JSON.stringify(item)}: ${parsed.error}`);
    }
    assert.equal(protocol.ModelItem.safeParse(FUTURE).success, false);
  });

  test("every item type reads back as added, and the derived view shows the conversation", async () => {
    const s = session("every-item");
    assert.equal(await s.getSessionId(), "every-item");
    await s.addItems(EVERY_ITEM);
    assert.deepEqual(await s.getItems(), EVERY_ITEM);
    assert.deepEqual(await s.getItems(3), EVERY_ITEM.slice(-3));
    const events = [];
    for await (const e of live.client.since("every-item")) events.push(e);
    assert.deepEqual(
      events.map((e) => [e.type, e.data.item_type]),
      [
        ["system_message", "message"],
        ["user_message", "message"],
        ["user_message", "message"],
        ["assistant_message", "message"],
        ["step_end", "reasoning"],
        ["assistant_message", "function_call"],
        ["tool_result", "function_call_result"],
        ["tool_result", "function_call_result"],
        ["tool_call", "hosted_tool_call"],
        ["tool_call", "computer_call"],
        ["tool_call", "computer_call_result"],
        ["tool_call", "shell_call"],
        ["tool_call", "shell_call_output"],
        ["tool_call", "apply_patch_call"],
        ["tool_call", "apply_patch_call_output"],
        ["tool_call", "tool_search_call"],
        ["tool_call", "tool_search_output"],
        ["step_end", "program"],
        ["step_end", "program_output"],
        ["step_end", "compaction"],
        ["step_end", "unknown"],
        ["step_end", "a_type_from_the_future"],
      ],
    );
    const { messages } = await live.client.deriveMessages("every-item");
    assert.deepEqual(
      messages.map((m) => [m.role, m.content]),
      [
        ["system", "Be brief."],
        ["user", "plain text"],
        ["user", "look at"],
        ["assistant", "Here\nnot that"],
        ["assistant", null],
        ["tool", "rain"],
        ["tool", "a photo"],
      ],
    );
    assert.deepEqual(messages[4].tool_calls, [
      { id: "call_1", type: "function", function: { name: "weather", arguments: '{"city":"Oslo"}' } },
    ]);
    assert.equal(messages[5].tool_call_id, "call_1");
  });

  test("separate sessions stay separate", async () => {
    const a = session("sep-a");
    const b = session("sep-b");
    await a.addItems([user("for a")]);
    await b.addItems([user("for b"), assistant("b's answer")]);
    assert.deepEqual(await a.getItems(), [user("for a")]);
    assert.deepEqual(await b.getItems(), [user("for b"), assistant("b's answer")]);
    await a.clearSession();
    assert.deepEqual(await a.getItems(), []);
    assert.equal((await b.getItems()).length, 2);
  });

  test("limit returns the latest N in order, read from the end past hides", async () => {
    const s = session("limits");
    const items = Array.from({ length: 80 }, (_, i) => user(`m${i}`));
    await s.addItems(items);
    assert.deepEqual(await s.getItems(2), items.slice(-2));
    assert.deepEqual(await s.getItems(50), items.slice(-50));
    assert.deepEqual(await s.getItems(500), items);
    assert.deepEqual(await s.getItems(0), []);
    for (let i = 0; i < 40; i++) await s.popItem();
    assert.deepEqual(await s.getItems(3), items.slice(37, 40));
    assert.deepEqual(await s.getItems(), items.slice(0, 40));
    await live.client.hide("limits", 10, 35);
    assert.deepEqual(await s.getItems(6), [...items.slice(8, 10), ...items.slice(36, 40)]);
  });

  test("popItem returns items newest first and then undefined; the log keeps them", async () => {
    const s = session("pops");
    const items = [user("q"), { type: "reasoning", id: "rs", content: [] }, assistant("a")];
    await s.addItems(items);
    assert.deepEqual(await s.popItem(), items[2]);
    assert.deepEqual(await s.popItem(), items[1]);
    assert.deepEqual(await s.getItems(), [items[0]]);
    assert.deepEqual(await s.popItem(), items[0]);
    assert.equal(await s.popItem(), undefined);
    assert.deepEqual(await s.getItems(), []);
    const stored = [];
    for await (const e of live.client.since("pops")) stored.push(e.type);
    assert.deepEqual(stored, ["user_message", "step_end", "assistant_message", "hide", "hide", "hide"]);
  });

  test("clearSession empties the view; new items show after it", async () => {
    const s = session("clears");
    await s.addItems([user("old"), assistant("older answer")]);
    await s.clearSession();
    assert.deepEqual(await s.getItems(), []);
    assert.deepEqual(await s.getItems(5), []);
    assert.equal(await s.popItem(), undefined);
    await s.addItems([user("new")]);
    assert.deepEqual(await s.getItems(), [user("new")]);
    assert.deepEqual((await live.client.deriveMessages("clears")).messages.map((m) => m.content), ["new"]);
  });

  test("pops after an add are one call each (the hide); a stale tail reads again", async () => {
    const client = new SessionLogClient(live.server.address);
    const reads = { listEvents: 0, since: 0 };
    for (const name of Object.keys(reads)) {
      const original = client[name].bind(client);
      client[name] = (...args) => {
        reads[name] += 1;
        return original(...args);
      };
    }
    try {
      const s = new SessionlogSession("tail-pops", client);
      const items = Array.from({ length: 30 }, (_, i) => user(`t${i}`));
      await s.addItems(items.slice(0, 10));
      assert.deepEqual(await s.popItem(), items[9]); // a read, then the hide
      await s.addItems(items.slice(9));
      reads.listEvents = 0;
      for (let i = 29; i >= 5; i--) assert.deepEqual(await s.popItem(), items[i]);
      assert.deepEqual(reads, { listEvents: 0, since: 0 });
      await session("tail-pops").addItems([user("theirs")]);
      assert.deepEqual(await s.popItem(), user("theirs"));
      assert.equal(reads.listEvents, 1);
      assert.deepEqual(await s.getItems(), items.slice(0, 5));
    } finally {
      client.close();
    }
  });

  test("a pop after the session was deleted and made again to the same length pops the new item", async () => {
    const s = session("remade");
    await s.addItems([user("a"), user("b")]);
    assert.deepEqual(await s.getItems(1), [user("b")]);
    await live.client.deleteSession("remade");
    await session("remade").addItems([user("x"), user("y")]);
    assert.deepEqual(await s.popItem(), user("y"));
    assert.deepEqual(await s.getItems(), [user("x")]);
  });

  test("concurrent popItem calls each take a different item", async () => {
    const items = Array.from({ length: 8 }, (_, i) => user(`c${i}`));
    await session("concurrent").addItems(items);
    const poppers = Array.from({ length: 4 }, () => session("concurrent"));
    const popped = (await Promise.all(poppers.flatMap((p) => [p.popItem(), p.popItem()]))).map((i) => i.content);
    assert.deepEqual(popped.sort(), items.map((i) => i.content).sort());
    assert.equal(await session("concurrent").popItem(), undefined);
  });

  test("DeriveMessages agrees with getItems after pops", async () => {
    const s = session("agree");
    await s.addItems([
      user("one"),
      assistant("two"),
      { type: "function_call", callId: "c1", name: "f", arguments: "{}" },
      { type: "function_call_result", callId: "c1", name: "f", status: "completed", output: "done" },
      assistant("three"),
    ]);
    await s.popItem();
    await s.popItem();
    const items = await s.getItems();
    assert.equal(items.length, 3);
    const { messages } = await live.client.deriveMessages("agree");
    assert.deepEqual(
      messages.map((m) => [m.role, m.content, m.tool_calls?.[0]?.id]),
      [
        ["user", "one", undefined],
        ["assistant", "two", undefined],
        ["assistant", null, "c1"],
      ],
    );
  });

  test("a summary another writer appends reads as the items its message is", async () => {
    const s = session("summarised");
    await s.addItems([user("a"), assistant("b"), user("c")]);
    await live.client.append("summarised", [{ type: "system_message", data: { content: "[a and b]" }, replace: [0, 1] }]);
    assert.deepEqual(await s.getItems(), [{ role: "system", content: "[a and b]" }, user("c")]);
    assert.deepEqual(await s.getItems(1), [user("c")]);
    assert.deepEqual(await s.popItem(), user("c"));
    assert.deepEqual(await s.popItem(), { role: "system", content: "[a and b]" });
    assert.equal(await s.popItem(), undefined);
  });

  test("getItems(limit) read from the end equals the full read's last items, over random logs", async () => {
    for (const seed of [1, 2, 3]) {
      const random = mulberry32(seed);
      const pick = (n) => Math.floor(random() * n);
      const id = `random-${seed}`;
      const s = session(id);
      let next = 0;
      for (let step = 0; step < 40; step++) {
        const roll = random();
        const length = (await live.client.listEvents(id, { pageSize: 1 })).eventCount;
        if (roll < 0.55 || length === 0) {
          const kinds = [user, (n) => ({ type: "reasoning", id: `rs${n}`, content: [] }), (n) => assistant(`a${n}`)];
          await s.addItems(Array.from({ length: 1 + pick(4) }, () => kinds[pick(3)](next++)));
        } else if (roll < 0.75) {
          const newest = (await s.getItems()).at(-1);
          assert.deepEqual(await s.popItem(), newest);
        } else if (roll < 0.87) {
          const start = pick(length);
          await live.client.hide(id, start, start + pick(6));
        } else if (roll < 0.97) {
          const start = pick(length);
          const summary = { type: "system_message", data: { content: `[summary ${step}]` }, replace: [start, start + pick(8)] };
          await live.client.append(id, [summary]);
        } else {
          await s.clearSession();
        }
        if (step % 4 !== 3) continue;
        const all = await s.getItems();
        for (const limit of [1, 2, 3, 5, 8, 13, 40, 200]) {
          assert.deepEqual(await s.getItems(limit), all.slice(-limit), `seed ${seed}, step ${step}, limit ${limit}`);
        }
      }
      assert.ok((await live.client.listEvents(id, { pageSize: 1 })).eventCount > 32, "the log spans several pages");
    }
  });

  test("a summary read on the last page but standing below it waits for the events between", async () => {
    const s = session("summary-below");
    const items = Array.from({ length: 100 }, (_, i) => user(`m${i}`));
    await s.addItems(items);
    await live.client.hide("summary-below", 40, 99);
    await live.client.append("summary-below", [{ type: "system_message", data: { content: "[five]" }, replace: [5, 5] }]);
    assert.deepEqual(await s.getItems(1), [items[39]]);
    assert.deepEqual(await s.getItems(2), items.slice(38, 40));
    const all = await s.getItems();
    assert.equal(all.length, 40);
    assert.deepEqual(all[5], { role: "system", content: "[five]" });
  });

  test("applyHistoryTransaction appends once per operation id; another transaction under it fails", async () => {
    const s = session("tx-append");
    const transaction = { type: "append_items", items: [user("q"), assistant("a")] };
    await s.applyHistoryTransaction({ operationId: "op-1", transaction });
    await s.applyHistoryTransaction({ operationId: "op-1", transaction });
    assert.deepEqual(await s.getItems(), [user("q"), assistant("a")]);
    const other = { type: "append_items", items: [user("something else")] };
    await assert.rejects(s.applyHistoryTransaction({ operationId: "op-1", transaction: other }), { reason: "REQUEST_ID_REUSED" });
    assert.equal((await live.client.listEvents("tx-append")).eventCount, 2);
  });

  test("applyHistoryTransaction replaces a matching suffix atomically, once; a mismatch changes nothing", async () => {
    const s = session("tx-replace");
    await s.addItems([user("a"), assistant("b"), user("c")]);
    const transaction = { type: "replace_suffix", expectedSuffix: [assistant("b"), user("c")], replacement: [user("x")] };
    await s.applyHistoryTransaction({ operationId: "op-r", transaction });
    assert.deepEqual(await s.getItems(), [user("a"), user("x")]);
    const length = (await live.client.listEvents("tx-replace")).eventCount;
    await s.applyHistoryTransaction({ operationId: "op-r", transaction });
    assert.equal((await live.client.listEvents("tx-replace")).eventCount, length);
    const stale = { type: "replace_suffix", expectedSuffix: [user("c")], replacement: [] };
    await assert.rejects(s.applyHistoryTransaction({ operationId: "op-s", transaction: stale }), {
      name: "HistoryTransactionError",
    });
    await assert.rejects(
      s.applyHistoryTransaction({ operationId: "op-r", transaction: { ...transaction, replacement: [user("y")] } }),
      { name: "HistoryTransactionError" },
    );
    assert.equal((await live.client.listEvents("tx-replace")).eventCount, length);
    assert.deepEqual((await live.client.deriveMessages("tx-replace")).messages.map((m) => m.content), ["a", "x"]);
    const empty = { type: "replace_suffix", expectedSuffix: [], replacement: [assistant("z")] };
    await s.applyHistoryTransaction({ operationId: "op-e", transaction: empty });
    assert.deepEqual(await s.getItems(), [user("a"), user("x"), assistant("z")]);
  });

  test("knownFrom: a tail decides the view from its first seq, or lower under a hide reaching it", () => {
    const at = (seq, replace) => ({ seq, type: "hide", time: "", data: {}, ...(replace ? { replace } : {}) });
    assert.equal(knownFrom([at(9), at(8)]), 8);
    assert.equal(knownFrom([at(9, [0, 7]), at(8)]), 0);
    assert.equal(knownFrom([at(9, [3, 5]), at(8)]), 8);
    assert.equal(knownFrom([at(10, [2, 4]), at(9, [5, 7]), at(8)]), 2);
  });

  test("the Python backend reads what this one wrote, and this one reads what Python wrote", async () => {
    const py = async (code, ...args) => {
      const { stdout } = await promisify(execFile)(PYTHON, ["-c", code, live.server.address, ...args], { timeout: 60_000 });
      return stdout;
    };
    await session("ts-wrote").addItems(EVERY_ITEM);
    const read = `
import asyncio, json, sys
from sessionlog_client.openai_agents import SessionlogSession
async def main():
    s = SessionlogSession(sys.argv[2], sys.argv[1])
    print(json.dumps({"all": await s.get_items(), "last": await s.get_items(2)}))
    await s.close()
asyncio.run(main())
`;
    const { stdout: cli } = await promisify(execFile)(
      SESSIONLOG_BIN,
      ["items", "ts-wrote", "--last", "2", "--server", live.server.address],
      { timeout: 60_000 },
    );
    assert.deepEqual(
      cli.trim().split("\n").map((line) => JSON.parse(line)),
      EVERY_ITEM.slice(-2).map((item, i) => ({ seq: EVERY_ITEM.length - 2 + i, item })),
    );
    const fromPython = JSON.parse(await py(read, "ts-wrote"));
    assert.deepEqual(fromPython.all, EVERY_ITEM);
    assert.deepEqual(fromPython.last, EVERY_ITEM.slice(-2));

    const pythonItems = [
      { role: "developer", content: "Be brief." },
      { type: "message", role: "user", content: [{ type: "input_text", text: "hi" }] },
      { type: "reasoning", id: "rs_9", summary: [{ type: "summary_text", text: "t" }] },
      { type: "function_call", call_id: "c9", name: "f", arguments: "{}", id: "fc_9" },
      { type: "function_call_output", call_id: "c9", output: "ok" },
      { type: "message", role: "assistant", content: [{ type: "output_text", text: "bye", annotations: [] }] },
      { type: "python_only_future_type", n: 3 },
    ];
    const write = `
import asyncio, json, sys
from sessionlog_client.openai_agents import SessionlogSession
async def main():
    s = SessionlogSession(sys.argv[2], sys.argv[1])
    await s.add_items(json.loads(sys.argv[3]))
    popped = await s.pop_item()
    print(json.dumps(popped))
    await s.close()
asyncio.run(main())
`;
    const popped = JSON.parse(await py(write, "py-wrote", JSON.stringify(pythonItems)));
    assert.deepEqual(popped, pythonItems.at(-1));
    const s = session("py-wrote");
    assert.deepEqual(await s.getItems(), pythonItems.slice(0, -1));
    assert.deepEqual(await s.popItem(), pythonItems.at(-2));
    assert.deepEqual(JSON.parse(await py(read, "py-wrote")).all, pythonItems.slice(0, -2));
  });

  test("a streamed run() stores the turn too", async () => {
    const streamingModel = {
      async getResponse() {
        throw new Error("this test streams");
      },
      async *getStreamedResponse() {
        yield { type: "response_started" };
        yield { type: "output_text_delta", delta: "Streamed." };
        const usage = { requests: 1, inputTokens: 3, outputTokens: 1, totalTokens: 4 };
        yield { type: "response_done", response: { id: "resp_s", usage, output: [assistant("Streamed.", "msg_s")] } };
      },
    };
    const s = session("agent-stream");
    const result = await run(new Agent({ name: "streamer", model: streamingModel }), "Stream it.", {
      session: s,
      stream: true,
    });
    for await (const _ of result) {
      // drain the events
    }
    await result.completed;
    assert.equal(result.finalOutput, "Streamed.");
    assert.deepEqual(await s.getItems(), [
      { type: "message", role: "user", content: "Stream it." },
      assistant("Streamed.", "msg_s"),
    ]);
  });

  test("run() of an Agent with a fake model stores the turn, and the next turn sees it", async () => {
    const inputs = [];
    const replies = [
      { output: [{ type: "function_call", id: "fc_1", callId: "call_w", name: "weather", arguments: '{"city":"Oslo"}', status: "completed" }] },
      { output: [assistant("Rain in Oslo.", "msg_1")] },
      { output: [assistant("You asked about Oslo.", "msg_2")] },
    ];
    /** The SDK's Model interface: answers from `replies`, no network. */
    const fakeModel = {
      async getResponse(request) {
        inputs.push(structuredClone(request.input));
        const reply = replies.shift();
        assert.ok(reply, "the model was called more often than scripted");
        return { usage: new Usage(), output: reply.output, responseId: `resp_${inputs.length}` };
      },
      async *getStreamedResponse() {
        throw new Error("not streamed in this test");
      },
    };
    const weather = tool({
      name: "weather",
      description: "The weather in a city.",
      parameters: z.object({ city: z.string() }),
      execute: async ({ city }) => `rain in ${city}`,
    });
    const agent = new Agent({ name: "helper", instructions: "Be brief.", model: fakeModel, tools: [weather] });
    const s = session("agent-run");

    const first = await run(agent, "Weather in Oslo?", { session: s });
    assert.equal(first.finalOutput, "Rain in Oslo.");
    const items = await s.getItems();
    assert.deepEqual(
      items.map((i) => i.type ?? "message"),
      ["message", "function_call", "function_call_result", "message"],
    );
    assert.equal(items[0].content, "Weather in Oslo?");
    assert.equal(items[2].callId, "call_w");
    assert.equal(items[3].content[0].text, "Rain in Oslo.");

    const second = await run(agent, "What did I ask?", { session: s });
    assert.equal(second.finalOutput, "You asked about Oslo.");
    const history = inputs.at(-1);
    assert.ok(Array.isArray(history));
    assert.equal(history.length, 5, JSON.stringify(history));
    assert.equal(history[0].content, "Weather in Oslo?");
    assert.equal(history[4].content, "What did I ask?");
    assert.equal((await s.getItems()).length, 6);
    const { messages } = await live.client.deriveMessages("agent-run");
    assert.deepEqual(
      messages.map((m) => [m.role, m.content]),
      [
        ["user", "Weather in Oslo?"],
        ["assistant", null],
        ["tool", "rain in Oslo"],
        ["assistant", "Rain in Oslo."],
        ["user", "What did I ask?"],
        ["assistant", "You asked about Oslo."],
      ],
    );
  });
});

test("a tenant's token keeps SessionlogSession inside its session prefix, writing nothing outside", async () => {
  const root = tempDir();
  const admin = "admin-admin-admin-0001";
  const tenant = "tenant-a-secret-0d9c2e7f";
  writeFileSync(
    join(root, "tokens.toml"),
    `[[token]]\nname = "admin"\ntoken = "${admin}"\npermissions = ["read", "write", "admin"]\n\n` +
      `[[token]]\nname = "tenant-a"\ntoken = "${tenant}"\npermissions = ["read", "write"]\nsession_prefix = "tenant-a."\n`,
  );
  const server = await startServer({ root, args: [...SERVE_ARGS, "--auth-tokens", join(root, "tokens.toml")], clientOptions: { token: admin } });
  const inside = new SessionlogSession("tenant-a.chat", server.address, { token: tenant });
  const outside = new SessionlogSession("tenant-b.chat", server.address, { token: tenant, retry: { giveUpAfterMs: 0 } });
  const adminClient = new SessionLogClient(server.address, { token: admin });
  try {
    await inside.addItems([user("mine")]);
    assert.deepEqual(await inside.getItems(), [user("mine")]);
    assert.deepEqual(await inside.getItems(1), [user("mine")]);
    await assert.rejects(outside.addItems([user("theirs")]), { reason: "PERMISSION_DENIED" });
    await assert.rejects(outside.getItems(), { reason: "PERMISSION_DENIED" });
    await assert.rejects(outside.getItems(1), { reason: "PERMISSION_DENIED" });
    await assert.rejects(outside.popItem(), { reason: "PERMISSION_DENIED" });
    assert.equal((await adminClient.listEvents("tenant-b.chat")).eventCount, 0);
    assert.deepEqual(await inside.popItem(), user("mine"));
  } finally {
    inside.close();
    outside.close();
    adminClient.close();
    await server.stop();
    server.remove();
  }
});
