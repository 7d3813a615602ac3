// Reads from the end against a real server: listEvents newest first, lastEvents, paged
// deriveMessages and lastMessages from the Node client.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { SessionLogClient } from "../src/index.js";
import { startServer } from "./server.mjs";

const user = (content) => ({ type: "user_message", data: { content } });

describe("reads from the end", () => {
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

  test("listEvents pages newest first, pinned; lastEvents returns seq order", async () => {
    await client.append("t", Array.from({ length: 12 }, (_, i) => user(`m${i}`)));
    const first = await client.listEvents("t", { pageSize: 5, orderBy: "seq desc" });
    assert.deepEqual(first.events.map((e) => e.seq), [11, 10, 9, 8, 7]);
    assert.equal(first.eventCount, 12);
    await client.append("t", [user("late")]);
    const second = await client.listEvents("t", { pageSize: 5, orderBy: "seq desc", pageToken: first.nextPageToken });
    assert.deepEqual(second.events.map((e) => e.seq), [6, 5, 4, 3, 2]);
    assert.deepEqual((await client.lastEvents("t", 3)).map((e) => e.data.content), ["m10", "m11", "late"]);
    assert.equal((await client.lastEvents("t", 100)).length, 13);
    await assert.rejects(
      client.listEvents("t", { orderBy: "seq", pageToken: first.nextPageToken }),
      (error) => error.reason === "INVALID_PAGE_TOKEN",
    );
    await assert.rejects(client.listEvents("t", { orderBy: "time" }), (error) => error.reason === "INVALID_ORDER_BY");
    await assert.rejects(client.lastEvents("t", -1), RangeError);
  });

  test("lastMessages equals the end of a full derive, across pages", async () => {
    const summary = { type: "user_message", data: { content: "summary" }, replace: [2, 6] };
    await client.append("d", [...Array.from({ length: 10 }, (_, i) => user(`m${i}`)), summary, user("after")]);
    const full = await client.deriveMessages("d");
    const last = await client.lastMessages("d", 3);
    assert.deepEqual(last.seqs, full.seqs.slice(-3));
    assert.deepEqual(last.messages, full.messages.slice(-3));
    assert.equal(last.replaceGeneration, 1);
    assert.ok(last.nextPageToken);
    const page = await client.deriveMessages("d", { pageSize: 2, pageToken: last.nextPageToken });
    assert.deepEqual(page.seqs, full.seqs.slice(-5, -3));
    assert.deepEqual((await client.lastMessages("d", 100)).seqs, full.seqs);
  });
});
