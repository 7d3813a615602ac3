// Reads from the end against a real server: listEvents newest first, lastEvents, paged
// deriveMessages and lastMessages from the Node client.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { useServer } from "./server.mjs";

const user = (content) => ({ type: "user_message", data: { content } });

describe("reads from the end", () => {
  const live = useServer();

  test("listEvents pages newest first, pinned; lastEvents returns seq order", async () => {
    await live.client.append("t", Array.from({ length: 12 }, (_, i) => user(`m${i}`)));
    const first = await live.client.listEvents("t", { pageSize: 5, orderBy: "seq desc" });
    assert.deepEqual(first.events.map((e) => e.seq), [11, 10, 9, 8, 7]);
    assert.equal(first.eventCount, 12);
    await live.client.append("t", [user("late")]);
    const second = await live.client.listEvents("t", { pageSize: 5, orderBy: "seq desc", pageToken: first.nextPageToken });
    assert.deepEqual(second.events.map((e) => e.seq), [6, 5, 4, 3, 2]);
    assert.deepEqual((await live.client.lastEvents("t", 3)).map((e) => e.data.content), ["m10", "m11", "late"]);
    assert.equal((await live.client.lastEvents("t", 100)).length, 13);
    await assert.rejects(
      live.client.listEvents("t", { orderBy: "seq", pageToken: first.nextPageToken }),
      (error) => error.reason === "INVALID_PAGE_TOKEN",
    );
    await assert.rejects(live.client.listEvents("t", { orderBy: "time" }), (error) => error.reason === "INVALID_ORDER_BY");
    await assert.rejects(live.client.lastEvents("t", -1), (error) => error.reason === "MALFORMED_REQUEST" && error.metadata.field === "n");
  });

  test("lastMessages equals the end of a full derive, across pages", async () => {
    const summary = { type: "user_message", data: { content: "summary" }, replace: [2, 6] };
    await live.client.append("d", [...Array.from({ length: 10 }, (_, i) => user(`m${i}`)), summary, user("after")]);
    const full = await live.client.deriveMessages("d");
    const last = await live.client.lastMessages("d", 3);
    assert.deepEqual(last.seqs, full.seqs.slice(-3));
    assert.deepEqual(last.messages, full.messages.slice(-3));
    assert.equal(last.replaceGeneration, 1);
    assert.ok(last.nextPageToken);
    const page = await live.client.deriveMessages("d", { pageSize: 2, pageToken: last.nextPageToken });
    assert.deepEqual(page.seqs, full.seqs.slice(-5, -3));
    assert.deepEqual((await live.client.lastMessages("d", 100)).seqs, full.seqs);
  });
});
