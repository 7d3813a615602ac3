// A seq the API takes as uint64, given as a negative, fractional or too large number: the client
// refuses it (protobufjs would send another seq in its place: redactEvents([-1]) redacted seq 0).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { SessionLogClient, SessionLogError } from "sessionlog-client";
import { startServer } from "./server.mjs";

const user = (content) => ({ type: "user_message", data: { content } });
const BAD = [-1, 1.5, Number.NaN, 2 ** 64, -1n, 2n ** 64n, "1"];
// The client's own refusal is its typed error, as a server's is: MALFORMED_REQUEST naming the field.
const refusedAs = (field) => (error) =>
  error instanceof SessionLogError && error.reason === "MALFORMED_REQUEST" && error.code === 3 && error.metadata.field === field;

describe("bad seqs", () => {
  let server;
  let client;

  before(async () => {
    server = await startServer();
    client = new SessionLogClient(server.address);
    await client.append("ts-bad", [user("a"), user("b"), user("c")]);
    await client.append("ts-bad", [{ type: "user_message", data: { content: "d" }, stateDelta: { k: 4 } }]);
  });

  after(async () => {
    client?.close();
    await server?.stop();
    server?.remove();
  });

  test("redactEvents refuses a bad seq and redacts nothing", async () => {
    for (const seq of BAD) {
      await assert.rejects(client.redactEvents("ts-bad", [seq]), refusedAs("seqs"), String(seq));
    }
    const stored = [];
    for await (const event of client.since("ts-bad")) stored.push(event);
    assert.deepEqual(stored.map((e) => e.redacted), [undefined, undefined, undefined, undefined]);
  });

  test("reads and writes that take a seq refuse a bad one before sending", async () => {
    for (const seq of BAD) {
      await assert.rejects(client.getState("ts-bad", { atSeq: seq }), refusedAs("atSeq"));
      await assert.rejects(client.getUsage("ts-bad", { atSeq: seq }), refusedAs("atSeq"));
      await assert.rejects(client.deriveMessages("ts-bad", { atSeq: seq }), refusedAs("atSeq"));
      await assert.rejects(client.forkSession("ts-bad", { atSeq: seq, sessionId: "ts-bad-fork" }), refusedAs("atSeq"));
      await assert.rejects(client.deleteSession("ts-bad", { expectedSeq: seq }), refusedAs("expectedSeq"));
      await assert.rejects(client.createSession("ts-bad-child", [], { parentSessionId: "ts-bad", parentSeq: seq }), refusedAs("parentSeq"));
    }
    for (const seq of [-1, 1.5]) {
      assert.throws(() => client.since("ts-bad", { seq }), refusedAs("seq"));
      assert.throws(() => client.follow("ts-bad", { seq }), refusedAs("seq"));
      await assert.rejects(client.lastEvents("ts-bad", seq), refusedAs("n"));
    }
    await assert.rejects(client.updateSession("ts-bad", {}), refusedAs("fields"));
    await assert.rejects(
      client.createSession("ts-bad-ttl", [], { ttlMs: 1000, expireTime: "2999-01-01T00:00:00Z" }),
      refusedAs("ttlMs"),
    );
    assert.equal((await client.getSession("ts-bad-ttl")).session.exists, false);
    assert.equal((await client.getSession("ts-bad")).session.eventCount, 4);
    assert.equal((await client.getSession("ts-bad-fork")).session.exists, false);
    assert.equal((await client.getSession("ts-bad-child")).session.exists, false);
    assert.deepEqual((await client.getState("ts-bad", { atSeq: 2 })).state, {});
    assert.deepEqual((await client.getState("ts-bad", { atSeq: 3n })).state, { k: 4 });
  });

  test("every listing refuses a negative or fractional pageSize as the server does", async () => {
    // protobufjs sent -1 in ListSessions' and ListLeaseAudit's uint32 as 4294967295: a full page.
    const invalidPageSize = (error) =>
      error instanceof SessionLogError && error.reason === "INVALID_PAGE_SIZE" && error.code === 3 && error.metadata.page_size === "-1";
    const first = (pages) => pages.next();
    await assert.rejects(first(client.listSessions({ pageSize: -1 })), invalidPageSize);
    await assert.rejects(first(client.listLeaseAudit({ pageSize: -1 })), invalidPageSize);
    await assert.rejects(client.listEvents("ts-bad", { pageSize: -1 }), invalidPageSize);
    await assert.rejects(client.deriveMessages("ts-bad", { pageSize: -1 }), invalidPageSize);
    await assert.rejects(first(client.listSessions({ pageSize: 1.5 })), refusedAs("pageSize"));
    assert.equal((await client.listEvents("ts-bad", { pageSize: 2 ** 40 })).events.length, 4);
  });
});
