// listLeaseAudit against a real server: every session's takeovers and forced releases, paged.
import assert from "node:assert/strict";
import { before, describe, test } from "node:test";

import { useServer } from "./server.mjs";

const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

describe("the lease audit across sessions", () => {
  const live = useServer();

  before(async () => {
    for (const [sessionId, old, next] of [["b.two", "x", "y"], ["a.one", "p", "q"]]) {
      await live.client.acquireLease(sessionId, old, { ttlMs: 1 });
      await sleep(10);
      await live.client.acquireLease(sessionId, next, { ttlMs: 60_000 });
    }
    await live.client.releaseLease("a.one", "ops", { force: true });
  });

  test("every page in session id order, each entry with its session and index", async () => {
    const pages = [];
    for await (const page of live.client.listLeaseAudit({ pageSize: 2 })) pages.push(page);
    assert.deepEqual(pages.map((p) => p.entries.length), [2, 1]);
    assert.equal(pages[1].nextPageToken, "");
    const entries = pages.flatMap((p) => p.entries);
    assert.deepEqual(
      entries.map((e) => [e.sessionId, e.index, e.kind, e.actor, e.previousHolder]),
      [
        ["a.one", 0, "LEASE_AUDIT_KIND_TAKEOVER", "q", "p"],
        ["a.one", 1, "LEASE_AUDIT_KIND_FORCED_RELEASE", "ops", "q"],
        ["b.two", 0, "LEASE_AUDIT_KIND_TAKEOVER", "y", "x"],
      ],
    );
    assert.match(entries[0].time, /^\d{4}-\d\d-\d\dT/);
    const { leaseAudit } = await live.client.getSession("a.one");
    assert.deepEqual(entries.slice(0, 2).map(({ sessionId, index, ...rest }) => rest), leaseAudit);
  });

  test("a prefix narrows the listing", async () => {
    const listed = [];
    for await (const page of live.client.listLeaseAudit({ prefix: "b." })) listed.push(...page.entries.map((e) => e.sessionId));
    assert.deepEqual(listed, ["b.two"]);
  });
});
