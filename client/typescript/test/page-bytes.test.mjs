// Pages that fit: listSessions with view "full" over sessions of large state. The server answers
// fewer sessions than pageSize when they would not fit in one reply (AIP-158); a client whose
// own maxMessageBytes is below the server's --max-message-size asks again for fewer.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { SessionLogClient } from "sessionlog-client";

import { useServer } from "./server.mjs";

const LIMIT = 256 << 10;
const withState = (n, size) => ({ type: "user_message", data: { content: `turn ${n}` }, stateDelta: { blob: `${n}:` + "s".repeat(size) } });

async function listed(client, options) {
  const pages = [];
  for await (const page of client.listSessions(options)) {
    pages.push(page);
    assert.ok(pages.length < 100, "the listing never ended");
  }
  return pages;
}

describe("listSessions pages of large sessions", () => {
  const live = useServer({ args: ["--max-message-size", String(LIMIT), "--max-event-size", "100KiB"] });
  const made = new Map();

  test("the server's pages hold fewer than pageSize, each session once with its state", async () => {
    for (let n = 0; n < 10; n++) {
      const id = `pb.${String(n).padStart(2, "0")}`;
      await live.client.append(id, [withState(n, 60 << 10)]);
      made.set(id, `${n}:` + "s".repeat(60 << 10));
    }
    const pages = await listed(live.client, { prefix: "pb.", pageSize: 100, view: "full" });
    assert.ok(pages.length >= 3, `${pages.length} pages for 600 KiB of state under a 256 KiB limit`);
    assert.ok(pages.every((page) => page.sessions.length > 0 && page.sessions.length < 100));
    const seen = pages.flatMap((page) => page.sessions.map((s) => [s.sessionId, s.state.blob]));
    assert.deepEqual(seen, [...made.entries()]);
  });

  test("a client that reads less than the server sends asks for smaller pages and still lists all", async () => {
    const small = new SessionLogClient(live.server.address, { maxMessageBytes: 150 << 10 });
    try {
      const pages = await listed(small, { prefix: "pb.", pageSize: 100, view: "full" });
      const seen = pages.flatMap((page) => page.sessions.map((s) => [s.sessionId, s.state.blob]));
      assert.deepEqual(seen, [...made.entries()]);
      const newest = await listed(small, { prefix: "pb.", orderBy: "update_time desc", view: "full" });
      assert.deepEqual(
        newest.flatMap((page) => page.sessions.map((s) => s.sessionId)),
        [...made.keys()].reverse(),
      );
    } finally {
      small.close();
    }
  });

  test("a session that alone cannot fit is RESPONSE_TOO_LARGE; the basic view lists it", async () => {
    const huge = [0, 1, 2].map((n) => ({ ...withState(n, 90 << 10), stateDelta: { [`k${n}`]: "h".repeat(90 << 10) } }));
    for (const event of huge) await live.client.append("pbhuge.a", [event]);
    const refused = await listed(live.client, { prefix: "pbhuge.", view: "full" }).catch((error) => error);
    assert.equal(refused.reason, "RESPONSE_TOO_LARGE", String(refused));
    assert.match(refused.message, /pbhuge\.a/);
    const basic = await listed(live.client, { prefix: "pbhuge." });
    assert.deepEqual(basic.flatMap((page) => page.sessions.map((s) => s.sessionId)), ["pbhuge.a"]);
  });
});
