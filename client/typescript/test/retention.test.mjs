// Retention from the Node client: createSession's ttlMs / expireTime / pinned, updateSession's,
// the sweeper deleting an expired session, and INVALID_EXPIRATION.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { SessionLogClient } from "sessionlog-client";
import { startServer } from "./server.mjs";

const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

describe("retention", () => {
  let server;
  let client;

  before(async () => {
    server = await startServer({ args: ["--retention-sweep-interval", "0.2"] });
    client = new SessionLogClient(server.address);
  });

  after(async () => {
    client?.close();
    await server?.stop();
    server?.remove();
  });

  test("a ttl'd session is swept; a pinned one stays until unpinned", async () => {
    const made = await client.createSession("ts-ttl", [], { ttlMs: 500 });
    assert.ok(Date.parse(made.session.expireTime) > Date.now() - 1000);
    assert.equal(made.session.pinned, false);
    const held = await client.createSession("ts-pin", [], { ttlMs: 500, pinned: true });
    assert.equal(held.session.pinned, true);
    for (let i = 0; i < 100 && (await client.getSession("ts-ttl")).session.exists; i++) await sleep(100);
    assert.equal((await client.getSession("ts-ttl")).session.exists, false);
    assert.equal((await client.getSession("ts-pin")).session.exists, true);
    const unpinned = await client.updateSession("ts-pin", { pinned: false });
    assert.equal(unpinned.pinned, false);
    for (let i = 0; i < 100 && (await client.getSession("ts-pin")).session.exists; i++) await sleep(100);
    assert.equal((await client.getSession("ts-pin")).session.exists, false);
  });

  test("updateSession sets, extends and clears the expiry", async () => {
    const later = new Date(Date.now() + 3_600_000);
    const made = await client.createSession("ts-upd", [], { expireTime: later });
    assert.equal(Date.parse(made.session.expireTime), later.getTime());
    const extended = await client.updateSession("ts-upd", { ttlMs: 7_200_000 });
    assert.ok(Date.parse(extended.expireTime) > later.getTime());
    const cleared = await client.updateSession("ts-upd", { expireTime: null });
    assert.equal(cleared.expireTime, undefined);
  });

  test("a zero ttl or a past time is INVALID_EXPIRATION", async () => {
    await assert.rejects(client.createSession("ts-bad", [], { ttlMs: 0 }), (e) => e.reason === "INVALID_EXPIRATION");
    const past = new Date(Date.now() - 60_000);
    await assert.rejects(client.createSession("ts-bad", [], { expireTime: past }), (e) => e.reason === "INVALID_EXPIRATION");
    assert.equal((await client.getSession("ts-bad")).session.exists, false);
  });
});
