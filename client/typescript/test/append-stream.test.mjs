// client.appendStream() against a real server: appends pipelined over one AppendStream call.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { AppendStream, DEFAULT_MAX_IN_FLIGHT, NotPrimaryError, SessionLogClient, SessionLogError } from "sessionlog-client";

import { startServer, useServer } from "./server.mjs";

const user = (content) => ({ type: "user_message", data: { content } });
const ABORTED = 10;
const CANCELLED = 1;
const UNAVAILABLE = 14;

/** The contents of a session's stored events, in seq order. */
async function contents(client, sessionId) {
  const seen = [];
  for await (const event of client.since(sessionId)) seen.push(event.data.content);
  return seen;
}

describe("appendStream", () => {
  const live = useServer();
  let replica;
  before(async () => {
    replica = await startServer({ args: ["--replica-of", live.server.address] });
  });
  after(async () => {
    await replica?.stop();
    replica?.remove();
  });

  test("pipelined appends to several sessions are written in the order sent, each answered", async () => {
    const stream = live.client.appendStream();
    assert.ok(stream instanceof AppendStream);
    assert.equal(stream.maxInFlight, DEFAULT_MAX_IN_FLIGHT);
    const sessions = ["pipe-a", "pipe-b", "pipe-c"];
    const sent = [];
    for (let i = 0; i < 40; i += 1) {
      for (const id of sessions) sent.push(stream.append(id, [user(`${id}-${i}`)], { expectedSeq: i }));
    }
    assert.ok(stream.inFlight > 1, "the appends were sent before any was answered");
    const results = await Promise.all(sent);
    results.forEach((result, n) => {
      const i = Math.floor(n / sessions.length);
      assert.equal(result.nextSeq, i + 1);
      assert.deepEqual(result.events.map((e) => [e.seq, e.data.content]), [[i, `${sessions[n % sessions.length]}-${i}`]]);
    });
    await stream.close();
    for (const id of sessions) {
      assert.deepEqual(await contents(live.client, id), Array.from({ length: 40 }, (_, i) => `${id}-${i}`));
    }
  });

  test("a SEQ_CONFLICT rejects only its own append; the stream goes on", async () => {
    const stream = live.client.appendStream();
    const first = stream.append("conflict", [user("one")], { expectedSeq: 0 });
    const clash = stream.append("conflict", [user("never")], { expectedSeq: 0 });
    const third = stream.append("conflict", [user("two")], { expectedSeq: 1 });
    assert.equal((await first).nextSeq, 1);
    await assert.rejects(clash, (error) => {
      assert.ok(error instanceof SessionLogError);
      assert.equal(error.reason, "SEQ_CONFLICT");
      assert.equal(error.code, ABORTED);
      assert.equal(error.metadata.next_seq, "1");
      return true;
    });
    assert.equal((await third).nextSeq, 2);
    assert.equal((await stream.append("conflict", [user("three")])).nextSeq, 3);
    await stream.close();
    assert.equal(stream.error, null);
    assert.deepEqual(await contents(live.client, "conflict"), ["one", "two", "three"]);
  });

  test("an append sent again with its requestId is written once", async () => {
    const stream = live.client.appendStream();
    const first = stream.append("replayed", [user("once")], { requestId: "turn-1" });
    const again = stream.append("replayed", [user("once")], { requestId: "turn-1" });
    const other = stream.append("replayed", [user("twice")]);
    assert.deepEqual([(await first).nextSeq, (await again).nextSeq, (await other).nextSeq], [1, 1, 2]);
    await stream.close();
    assert.deepEqual(await contents(live.client, "replayed"), ["once", "twice"]);
  });

  test("an append the client refuses (bad event) rejects alone, before anything is sent", async () => {
    const stream = live.client.appendStream();
    await assert.rejects(stream.append("bad", [{ type: "no_such_type", data: {} }]), /no_such_type|event type/i);
    assert.equal((await stream.append("bad", [user("fine")])).nextSeq, 1);
    await stream.close();
  });

  test("close() waits for every answer, then refuses more appends", async () => {
    const stream = live.client.appendStream({ maxInFlight: 4 });
    const settled = [];
    const sent = Array.from({ length: 20 }, (_, i) =>
      stream.append("closing", [user(`c-${i}`)]).then((result) => settled.push(result.nextSeq)),
    );
    await stream.close();
    assert.deepEqual(settled, Array.from({ length: 20 }, (_, i) => i + 1), "every append was answered before close() resolved");
    await Promise.all(sent);
    await assert.rejects(stream.append("closing", [user("late")]), /closed/);
    await stream.close(); // again: resolves at once
    await live.client.appendStream().close(); // nothing sent: resolves, no call opened
    assert.equal((await contents(live.client, "closing")).length, 20);
  });

  test("at most maxInFlight appends are unanswered; later ones wait for a slot, in order", async () => {
    const stream = live.client.appendStream({ maxInFlight: 2 });
    let most = 0;
    const sent = [];
    for (let i = 0; i < 12; i += 1) {
      sent.push(
        stream.append("window", [user(`w-${i}`)], { expectedSeq: i }).then((result) => {
          most = Math.max(most, stream.inFlight);
          return result.nextSeq;
        }),
      );
      most = Math.max(most, stream.inFlight);
    }
    assert.equal(stream.inFlight, 2, "two sent, ten waiting");
    assert.deepEqual(await Promise.all(sent), Array.from({ length: 12 }, (_, i) => i + 1));
    assert.ok(most <= 2, `at most 2 in flight, saw ${most}`);
    await stream.close();
    assert.throws(() => live.client.appendStream({ maxInFlight: 0 }), RangeError);
  });

  test("cancel() rejects what is unanswered with CANCELLED, and every later append", async () => {
    const stream = live.client.appendStream();
    const sent = Array.from({ length: 50 }, (_, i) => stream.append("cancelled", [user(`x-${i}`)]));
    stream.cancel();
    const outcomes = await Promise.allSettled(sent);
    const rejected = outcomes.filter((o) => o.status === "rejected");
    assert.ok(rejected.length > 0);
    for (const { reason } of rejected) assert.equal(reason.code, CANCELLED);
    await assert.rejects(stream.append("cancelled", [user("late")]), (error) => error === stream.error);
    await stream.close();
  });

  test("a replica's NOT_PRIMARY rejects as NotPrimaryError and points the client at the primary", async () => {
    const group = new SessionLogClient([replica.address, live.server.address]);
    try {
      assert.equal(group.current, replica.address);
      const onReplica = group.appendStream();
      await assert.rejects(onReplica.append("routed", [user("no")]), (error) => {
        assert.ok(error instanceof NotPrimaryError);
        assert.equal(error.reason, "NOT_PRIMARY");
        assert.equal(error.primary, live.server.address);
        return true;
      });
      await onReplica.close();
      assert.equal(onReplica.error, null, "a refused append does not end the stream");
      assert.equal(group.current, live.server.address);
      const onPrimary = group.appendStream();
      assert.equal((await onPrimary.append("routed", [user("yes")])).nextSeq, 1);
      await onPrimary.close();
    } finally {
      group.close();
    }
  });

  test("client.close() cancels an open stream", async () => {
    const closing = new SessionLogClient(live.server.address);
    const shut = closing.appendStream();
    await shut.append("shut", [user("one")]);
    closing.close();
    assert.equal(shut.error?.code, CANCELLED);
    await shut.close();
  });

  // Last: it kills this block's server.
  test("a server gone rejects what is pending with UNAVAILABLE, and every later append", async () => {
    const client = new SessionLogClient(live.server.address, { retry: { giveUpAfterMs: 0 } });
    try {
      const stream = client.appendStream();
      assert.equal((await stream.append("broken", [user("before")])).nextSeq, 1);
      await live.server.kill();
      await assert.rejects(stream.append("broken", [user("after")]), (error) => {
        assert.ok(error instanceof SessionLogError);
        assert.equal(error.code, UNAVAILABLE);
        return true;
      });
      assert.equal(stream.error?.code, UNAVAILABLE);
      await assert.rejects(stream.append("broken", [user("later")]), (error) => error === stream.error);
      await stream.close(); // resolves: the stream has ended
    } finally {
      client.close();
    }
  });
});

test("a stream to an address nobody listens on rejects its appends with UNAVAILABLE naming it", async () => {
  const client = new SessionLogClient("127.0.0.1:1");
  try {
    const stream = client.appendStream();
    const sent = [stream.append("nowhere", [user("a")]), stream.append("nowhere", [user("b")])];
    for (const outcome of await Promise.allSettled(sent)) {
      assert.equal(outcome.status, "rejected");
      assert.equal(outcome.reason, stream.error);
    }
    assert.equal(stream.error.code, UNAVAILABLE);
    assert.match(stream.error.message, /127\.0\.0\.1:1/);
    await stream.close();
  } finally {
    client.close();
  }
});

test("a shardMap client refuses appendStream(): it would not route by session", () => {
  const client = new SessionLogClient("127.0.0.1:1", { shardMap: "server" });
  try {
    assert.throws(() => client.appendStream(), (error) => error instanceof TypeError && /shard map/.test(error.message));
  } finally {
    client.close();
  }
});
