// The Node client across a group: a primary and a replica (real `sessionlog serve` processes),
// several addresses in either order, NOT_PRIMARY hints, etcd discovery, and a failover done with
// today's pieces: SIGKILL the primary, restart the replica's folder as the primary, restart the
// old primary's folder as its replica. Replication is asynchronous, so before the kill the test
// holds the writer between two appends until the replica has what the primary committed (what
// --ack replica will guarantee); what the writer does after that is the client's doing.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { test } from "node:test";

import grpc from "@grpc/grpc-js";

import {
  EPOCH_KEY,
  LeadershipLostError,
  NotPrimaryError,
  ReplicasUnavailableError,
  SessionLogClient,
  SessionLogError,
} from "sessionlog-client";

import { SESSIONLOG_BIN, freePort, startEtcd, startServer, tempDir } from "./server.mjs";

const RETRY = { giveUpAfterMs: 60_000, initialBackoffMs: 20, maxBackoffMs: 250 };
const WRITES = 40;
const LEADER = "/sessionlog/groups/g1/leader";
const user = (content) => ({ type: "user_message", data: { content } });
const UNAVAILABLE = 14;
const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

async function group() {
  const primary = await startServer({ root: tempDir() });
  const replica = await startServer({ root: tempDir(), args: ["--replica-of", primary.address] });
  const nodes = { primary, replica };
  return {
    nodes,
    /** Stop whatever runs (by PID) and delete the folders. */
    async close() {
      for (const node of Object.values(nodes)) {
        await node.stop();
        node.remove();
      }
    },
  };
}

/** Today's promotion: restart the replica's folder as the primary, then the (killed) old
 * primary's folder as its replica. */
async function promote(nodes) {
  const { primary: old, replica } = nodes;
  await replica.stop();
  nodes.replica = await startServer({ root: replica.root, port: replica.port });
  nodes.primary = await startServer({ root: old.root, port: old.port, args: ["--replica-of", replica.address] });
}

async function eventCount(address, sessionId) {
  const direct = new SessionLogClient(address, { retry: RETRY });
  try {
    return (await direct.getSession(sessionId)).session.eventCount;
  } finally {
    direct.close();
  }
}

/** Until the replica holds as many events of the session as the primary. */
async function caughtUp(nodes, sessionId) {
  const want = await eventCount(nodes.primary.address, sessionId);
  const deadline = Date.now() + 20_000;
  while ((await eventCount(nodes.replica.address, sessionId)) !== want) {
    assert.ok(Date.now() < deadline, "the replica did not catch up");
    await sleep(20);
  }
}

async function contents(address, sessionId) {
  const direct = new SessionLogClient(address, { retry: RETRY });
  try {
    const out = [];
    for await (const event of direct.since(sessionId)) out.push([event.seq, event.data.content]);
    return out;
  } finally {
    direct.close();
  }
}

test("writes go to the primary whatever the order; one address as a string routes nowhere", async () => {
  const g = await group();
  const { primary, replica } = g.nodes;
  const clients = [];
  try {
    for (const order of [[replica.address, primary.address], [primary.address, replica.address]]) {
      const client = new SessionLogClient(order, { retry: RETRY });
      clients.push(client);
      const id = `s-${order[0] === primary.address ? "p" : "r"}`;
      await client.append(id, [user("one")]);
      assert.equal(client.current, primary.address);
      await client.createSession(`${id}-t`, [user("two")]); // never retried, yet the hint is followed
      assert.equal((await client.getSession(`${id}-t`)).session.eventCount, 1);
      assert.deepEqual(client.members, order);
      assert.deepEqual(await contents(primary.address, id), [[0, "one"]]);
    }
    const deadline = Date.now() + 20_000; // the replica holds epoch 1's writes: it knows epoch 1
    while ((await eventCount(replica.address, "s-p")) !== 1) {
      assert.ok(Date.now() < deadline, "the replica did not catch up");
      await sleep(20);
    }
    const single = new SessionLogClient(replica.address, { retry: RETRY });
    clients.push(single);
    await assert.rejects(single.append("s", [user("one")]), (error) => {
      assert.ok(error instanceof SessionLogError);
      assert.ok(error instanceof NotPrimaryError);
      assert.equal(error.reason, "NOT_PRIMARY");
      assert.equal(error.metadata.primary, primary.address);
      assert.equal(error.primary, primary.address);
      assert.equal(error.epoch, 1);
      return true;
    });
    assert.deepEqual(single.members, [replica.address]);
  } finally {
    for (const client of clients) client.close();
    await g.close();
  }
});

test("when no address of the list ever answers, a call rejects at once naming them all", async () => {
  const addresses = [`127.0.0.1:${await freePort()}`, `127.0.0.1:${await freePort()}`];
  const client = new SessionLogClient(addresses, { retry: RETRY, connectTimeoutMs: 1000 });
  const started = Date.now();
  try {
    await assert.rejects(client.getSession("s"), (error) => {
      assert.equal(error.reason, "UNAVAILABLE");
      for (const address of addresses) assert.ok(error.message.includes(address), error.message);
      return true;
    });
  } finally {
    client.close();
  }
  assert.ok(Date.now() - started < 10_000, "waited for the retry budget instead");
});

test("a writer with request ids and a follow survive SIGKILL of the primary and a promotion", async () => {
  const g = await group();
  const { nodes } = g;
  const order = [nodes.replica.address, nodes.primary.address];
  const writes = new SessionLogClient(order, { retry: RETRY });
  const reads = new SessionLogClient(order, { retry: RETRY });
  const stream = reads.follow("s", { heartbeatMs: 500 });
  try {
    const seen = (async () => {
      const out = [];
      const timer = setTimeout(() => stream.close(), 90_000);
      for await (const event of stream) {
        out.push([event.seq, event.data.content]);
        if (out.length === WRITES) break;
      }
      clearTimeout(timer);
      return out;
    })();
    const acked = new Map();
    let hold = null;
    let inFlight = null;
    let slowest = 0;
    const writer = (async () => {
      for (let n = 0; n < WRITES; n += 1) {
        while (hold) await hold;
        const started = Date.now();
        inFlight = writes.append("s", [user(`n${n}`)], { requestId: `r${n}` });
        const reply = await inFlight;
        inFlight = null;
        slowest = Math.max(slowest, Date.now() - started);
        acked.set(`r${n}`, reply.events[0].seq);
        await sleep(10);
      }
    })();
    while (acked.size < 15) await sleep(10);
    let release;
    hold = new Promise((done) => (release = done)); // between two appends:
    await inFlight;
    await caughtUp(nodes, "s"); // the replica has everything, then the primary dies
    await nodes.primary.kill();
    hold = null;
    release();
    await promote(nodes); // the writer goes on meanwhile, against a dead primary
    await writer;
    const expected = Array.from({ length: WRITES }, (_, n) => [n, `n${n}`]);
    assert.deepEqual([...acked.entries()], expected.map(([n]) => [`r${n}`, n]));
    assert.deepEqual(await contents(nodes.replica.address, "s"), expected);
    assert.deepEqual(await seen, expected);
    assert.ok(stream.reconnects >= 1);
    assert.ok(slowest > 300, `no append waited for the promotion (slowest ${slowest} ms)`);
    assert.equal(writes.current, nodes.replica.address);
    const again = await writes.append("s", [user("n3")], { requestId: "r3" }); // acknowledged before
    assert.equal(again.events[0].seq, 3);
    assert.deepEqual(await contents(nodes.replica.address, "s"), expected);
  } finally {
    stream.close();
    writes.close();
    reads.close();
    await g.close();
  }
});

test("an append moves on from a frozen (SIGSTOPped) primary to the promoted replica", async () => {
  const g = await group();
  const { nodes } = g;
  const client = new SessionLogClient([nodes.primary.address, nodes.replica.address], { retry: RETRY, timeoutMs: 1000 });
  const frozen = nodes.primary.pids(); // the server and its workers
  try {
    await client.append("s", [user("n0")], { requestId: "r0" });
    await caughtUp(nodes, "s");
    for (const pid of frozen) process.kill(pid, "SIGSTOP");
    let settled = false;
    const pending = client.append("s", [user("n1")], { requestId: "r1" }).finally(() => (settled = true));
    await sleep(1500); // its first try has run into its deadline at the frozen primary
    assert.equal(settled, false);
    await nodes.replica.stop();
    nodes.replica = await startServer({ root: nodes.replica.root, port: nodes.replica.port });
    const reply = await pending;
    assert.equal(reply.events[0].seq, 1);
    assert.equal(client.current, nodes.replica.address);
  } finally {
    client.close();
    for (const pid of frozen.slice(1)) process.kill(pid, "SIGKILL"); // ends a stopped process too
    await nodes.primary.kill();
    await g.close();
  }
});

test("etcd names the primary, then the new one after a failover; no leader key: no primary", async () => {
  const etcd = await startEtcd();
  const g = await group();
  const { nodes } = g;
  const cluster = `etcd://127.0.0.1:1,${etcd.address}`; // the first endpoint is down
  const lost = new SessionLogClient(undefined, { cluster, group: "g1", retry: { giveUpAfterMs: 500, initialBackoffMs: 50 } });
  const client = new SessionLogClient(undefined, { cluster, group: "g1", retry: RETRY });
  try {
    await assert.rejects(lost.append("s", [user("nowhere")]), /no leader/);
    await etcd.put(LEADER, nodes.primary.address);
    await client.append("s", [user("n0")], { requestId: "r0" });
    assert.equal(client.current, nodes.primary.address);
    await caughtUp(nodes, "s");
    await nodes.primary.kill();
    const old = nodes.primary;
    await nodes.replica.stop();
    nodes.replica = await startServer({ root: nodes.replica.root, port: nodes.replica.port });
    await etcd.put(LEADER, nodes.replica.address);
    // The old primary is down: the client learns the new one from etcd, not from a hint.
    await client.append("s", [user("n1")], { requestId: "r1" });
    assert.equal(client.current, nodes.replica.address);
    nodes.primary = await startServer({ root: old.root, port: old.port, args: ["--replica-of", nodes.replica.address] });
    assert.deepEqual(await contents(nodes.replica.address, "s"), [[0, "n0"], [1, "n1"]]);
  } finally {
    lost.close();
    client.close();
    await g.close();
    await etcd.stop();
  }
});

/** How many Appends the server with the metrics endpoint at address refused NOT_PRIMARY. */
async function refusedAppends(address) {
  const text = await (await fetch(`http://${address}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
  const wanted = 'sessionlog_requests_total{method="Append",reason="NOT_PRIMARY"}';
  return text
    .split("\n")
    .filter((line) => line.startsWith(wanted))
    .reduce((sum, line) => sum + Number(line.split(" ").at(-1)), 0);
}

/** `sessionlog admin promote` against a running replica (no --fence): its new epoch. */
function adminPromote(address) {
  const done = spawnSync(SESSIONLOG_BIN, ["admin", "promote", "--server", address, "--json"], {
    encoding: "utf8",
    timeout: 30_000,
    env: Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("SESSIONLOG_"))),
  });
  assert.equal(done.status, 0, done.stderr);
  return JSON.parse(done.stdout).epoch;
}

test("once it has seen the newer epoch, the client never writes to a deposed primary restarted unfenced", async () => {
  const g = await group();
  const { nodes } = g;
  const client = new SessionLogClient([nodes.primary.address, nodes.replica.address], { retry: RETRY });
  const unaware = [];
  try {
    await client.append("s", [user("n0")], { requestId: "r0" });
    assert.equal(client.epoch, 1);
    await caughtUp(nodes, "s");
    const old = nodes.primary;
    await old.kill();
    assert.equal(adminPromote(nodes.replica.address), 2);
    await client.append("s", [user("n1")], { requestId: "r1" }); // the old one is down: moves on
    assert.deepEqual([client.current, client.epoch], [nodes.replica.address, 2]);
    const metrics = `127.0.0.1:${await freePort()}`;
    const restarted = { root: old.root, port: old.port, args: ["--metrics-listen", metrics] };
    nodes.primary = await startServer(restarted); // unfenced, as a primary
    const fresh = new SessionLogClient(nodes.primary.address, { retry: RETRY });
    unaware.push(fresh);
    await fresh.append("elsewhere", [user("x")]); // it knows no better: taken at epoch 1
    assert.equal(fresh.epoch, 1);

    const promoted = nodes.replica;
    await promoted.stop();
    let settled = false;
    const pending = client.append("s", [user("n2")], { requestId: "r2" }).finally(() => (settled = true));
    await sleep(1500); // every try meets the old primary (refused) or the stopped new one
    assert.equal(settled, false);
    assert.equal(await eventCount(nodes.primary.address, "s"), 1);
    assert.ok((await refusedAppends(metrics)) >= 1, "the client never tried the old primary");
    nodes.replica = await startServer({ root: promoted.root, port: promoted.port });
    const reply = await pending;
    assert.equal(reply.events[0].seq, 2);
    assert.equal(client.current, nodes.replica.address);
    assert.equal(await eventCount(nodes.primary.address, "s"), 1); // nothing written there
    assert.deepEqual(await contents(nodes.replica.address, "s"), [[0, "n0"], [1, "n1"], [2, "n2"]]);
  } finally {
    for (const other of unaware) other.close();
    client.close();
    await g.close();
  }
});

test("an appendStream learns the epoch from its headers, sends it, and is never acknowledged by a deposed primary", async () => {
  const g = await group();
  const { nodes } = g;
  const client = new SessionLogClient([nodes.primary.address, nodes.replica.address], { retry: RETRY });
  let unaware;
  try {
    const first = client.appendStream();
    assert.equal((await first.append("s", [user("n0")], { requestId: "r0" })).nextSeq, 1);
    await first.close();
    assert.equal(client.epoch, 1, "learnt from the stream alone (a fresh store: its trailers)");
    await caughtUp(nodes, "s");
    const old = nodes.primary;
    await old.kill();
    assert.equal(adminPromote(nodes.replica.address), 2);
    await client.append("s", [user("n1")], { requestId: "r1" });
    assert.deepEqual([client.current, client.epoch], [nodes.replica.address, 2]);
    nodes.primary = await startServer({ root: old.root, port: old.port }); // unfenced, as a primary

    // The new primary stops: a stream there breaks, and the client moves on to the old one.
    const promoted = nodes.replica;
    await promoted.stop();
    const broken = client.appendStream();
    await assert.rejects(broken.append("s", [user("lost")], { requestId: "r2" }), (error) => error.code === UNAVAILABLE);
    assert.equal(client.current, nodes.primary.address);
    // A stream on the deposed primary carries epoch 2: each append refused, nothing written,
    // and the deposed primary is not taken for the primary.
    const refused = client.appendStream();
    const tries = [refused.append("s", [user("never")], { requestId: "r2" }), refused.append("t", [user("never")])];
    for (const tried of tries) {
      await assert.rejects(tried, (error) => {
        assert.ok(error instanceof NotPrimaryError, String(error));
        assert.equal(error.epoch, 1);
        return true;
      });
    }
    await refused.close();
    assert.notEqual(client.current, nodes.primary.address);
    assert.deepEqual([await eventCount(nodes.primary.address, "s"), await eventCount(nodes.primary.address, "t")], [1, 0]);

    // A client that knows no better writes there (its headers say epoch 1); once it learns of
    // epoch 2 (as from another reply), that stream's acknowledgements are not acknowledgements.
    unaware = new SessionLogClient(nodes.primary.address, { retry: RETRY });
    const late = unaware.appendStream();
    assert.equal((await late.append("u", [user("taken")])).nextSeq, 1);
    assert.equal(unaware.epoch, 1, "learnt from the stream's headers, before its end");
    const newer = new grpc.Metadata();
    newer.add(EPOCH_KEY, "2");
    unaware._accepted(unaware._members[0], newer, "other"); // a reply from the new primary
    await assert.rejects(late.append("u", [user("deposed")], { requestId: "r-u" }), (error) => {
      assert.ok(error instanceof LeadershipLostError, String(error));
      assert.equal(error.committed, true);
      return true;
    });
    await late.close();

    nodes.replica = await startServer({ root: promoted.root, port: promoted.port });
    const again = client.appendStream();
    assert.equal((await again.append("s", [user("n2")], { requestId: "r2" })).nextSeq, 3);
    await again.close();
    assert.equal(client.current, nodes.replica.address);
    assert.deepEqual(await contents(nodes.replica.address, "s"), [[0, "n0"], [1, "n1"], [2, "n2"]]);
  } finally {
    unaware?.close();
    client.close();
    await g.close();
  }
});

test("REPLICAS_UNAVAILABLE is a ReplicasUnavailableError, retried a bounded number of times", async () => {
  const server = await startServer({ root: tempDir(), args: ["--ack", "replica", "--sync-timeout", "0.3"] });
  const client = new SessionLogClient(server.address, { retry: { ...RETRY, replicasRetries: 1 } });
  try {
    const started = Date.now();
    await assert.rejects(client.append("s", [user("one")], { requestId: "r1" }), (error) => {
      assert.ok(error instanceof ReplicasUnavailableError, String(error));
      assert.deepEqual([error.needed, error.counted, error.position], [1, 0, 1]);
      assert.equal(error.reason, "REPLICAS_UNAVAILABLE");
      assert.match(error.message, /committed on this primary/);
      return true;
    });
    assert.ok(Date.now() - started >= 600, "sent once, not twice");
    await assert.rejects(client.createSession("t", [user("x")]), ReplicasUnavailableError); // never retried
    assert.equal((await client.getSession("s")).session.eventCount, 1); // committed, once
  } finally {
    client.close();
    await server.stop();
    server.remove();
  }
});
