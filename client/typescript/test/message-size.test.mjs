// Oversized requests (issue 31): gRPC's bare "larger than max" becomes an error naming the limit
// and the setting to change; nothing is written and the server keeps serving.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { SessionLogClient } from "sessionlog-client";

import { useServer } from "./server.mjs";

const big = (size) => ({ type: "user_message", data: { content: "x".repeat(size) } });

async function assertUntouchedAndServing(client, id) {
  assert.equal((await client.getSession(id)).session.exists, false, "the oversized append wrote something");
  assert.equal(Number((await client.append(id, [big(2)])).nextSeq), 1);
}

describe("oversized requests", () => {
  const live = useServer();

  test("a 20 MB event names the server's limit and --max-message-size", async () => {
    const refused = await live.client.append("size.twenty", [big(20_000_000)]).catch((error) => error);
    assert.equal(refused.reason, "REQUEST_TOO_LARGE", String(refused));
    assert.match(refused.message, /4194304-byte message limit \(--max-message-size\)/);
    await assertUntouchedAndServing(live.client, "size.twenty");
  });

  test("past the server's transport margin: still REQUEST_TOO_LARGE naming the setting", async () => {
    const refused = await live.client.append("size.past", [big(40 << 20)]).catch((error) => error);
    assert.equal(refused.reason, "REQUEST_TOO_LARGE", String(refused));
    assert.match(refused.message, /--max-message-size/);
    assert.doesNotMatch(refused.message, /^SERVER: Received/);
    await assertUntouchedAndServing(live.client, "size.past");
  });

  test("over this client's own maxMessageBytes: not sent, the option named", async () => {
    const small = new SessionLogClient(live.server.address, { maxMessageBytes: 2 << 20 });
    try {
      const refused = await small.append("size.local", [big(3 << 20)]).catch((error) => error);
      assert.equal(refused.reason, "REQUEST_TOO_LARGE", String(refused));
      assert.match(refused.message, /2097152-byte message limit/);
      assert.match(refused.message, /maxMessageBytes/);
      await assertUntouchedAndServing(small, "size.local");
    } finally {
      small.close();
    }
  });
});
