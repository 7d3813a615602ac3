// Epochs per group: two groups elect their leaders apart, so one client writing to both (through
// HAProxy) keeps one highest epoch per group and sends each write its own group's (the Python
// client's tests/unit/test_group_epochs.py): the routing table alone (no server dialled), then
// one client through a real HAProxy to two static groups of real servers at different epochs.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, openSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { join } from "node:path";
import { test } from "node:test";

import grpc from "@grpc/grpc-js";

import { EPOCH_GROUP_KEY, EPOCH_KEY, LeadershipLostError, SessionLogClient, slotOf } from "sessionlog-client";

import { SESSIONLOG_BIN, freePort, startServer, tempDir } from "./server.mjs";

/** A reply's trailing metadata: epoch, and group when given. */
function trailers(epoch, group) {
  const metadata = new grpc.Metadata();
  metadata.add(EPOCH_KEY, String(epoch));
  if (group) metadata.add(EPOCH_GROUP_KEY, group);
  return metadata;
}

/** What a write for sessionId sends: [epoch, group] (undefined where absent). */
function sent(client, sessionId) {
  const metadata = client._metadata(true, sessionId);
  return [metadata.get(EPOCH_KEY)[0], metadata.get(EPOCH_GROUP_KEY)[0]];
}

function withClient(body) {
  const client = new SessionLogClient("127.0.0.1:1"); // one address, as through a proxy
  try {
    return body(client, client._members[0]);
  } finally {
    client.close();
  }
}

const [A, B] = ["alpha", "beta"];

test("the client keeps one epoch per group and sends a write its session's own", () => {
  assert.notEqual(slotOf(A), slotOf(B));
  withClient((client, member) => {
    assert.deepEqual(sent(client, A), [undefined, undefined]); // nothing learnt yet
    client._accepted(member, trailers(11, "g1"), A);
    client._accepted(member, trailers(9, "g2"), B);
    assert.deepEqual(sent(client, A), ["11", "g1"]);
    assert.deepEqual(sent(client, B), ["9", "g2"]);
    assert.deepEqual(sent(client, "a-session-of-an-unknown-slot"), [undefined, undefined]);
    assert.equal(client._metadata(false, A).get(EPOCH_KEY).length, 0, "reads carry no epoch");
    assert.equal(client.epoch, 11, "client.epoch: the highest of any group");
  });
});

test("an error's trailers teach the group's epoch too", () => {
  withClient((client, member) => {
    client._accepted(member, trailers(11, "g1"), A);
    const refusal = { code: grpc.status.FAILED_PRECONDITION, details: "no", metadata: trailers(4, "g2") };
    client._after(member, refusal, false, 0, false, B);
    assert.deepEqual(sent(client, B), ["4", "g2"]);
    assert.deepEqual(sent(client, A), ["11", "g1"]);
  });
});

test("a lower epoch of the same group is still a deposed leader", () => {
  withClient((client, member) => {
    client._accepted(member, trailers(11, "g1"), A);
    client._accepted(member, trailers(3, "g2"), B); // g2's own: not deposed
    assert.throws(() => client._accepted(member, trailers(10, "g1"), A), LeadershipLostError);
  });
});

test("an AppendStream sends its first session's group's epoch, else the one group known", () => {
  withClient((client, member) => {
    const streamSent = (sessionId) => {
      const metadata = client._streamMetadata(sessionId);
      assert.equal(metadata.get("x-session-id").length, 0, "a stream names no session");
      return [metadata.get(EPOCH_KEY)[0], metadata.get(EPOCH_GROUP_KEY)[0]];
    };
    assert.deepEqual(streamSent(A), [undefined, undefined]);
    client._accepted(member, trailers(11, "g1"), A);
    assert.deepEqual(streamSent("a-session-of-an-unknown-slot"), ["11", "g1"], "the only group known");
    client._accepted(member, trailers(9, "g2"), B);
    assert.deepEqual(streamSent(A), ["11", "g1"]);
    assert.deepEqual(streamSent(B), ["9", "g2"]);
    assert.deepEqual(streamSent("a-session-of-an-unknown-slot"), [undefined, undefined], "two groups: none guessed");
    assert.deepEqual(client._opened(member, trailers(12, "g2")), { epoch: 12, group: "g2" });
    assert.deepEqual(streamSent(B), ["12", "g2"], "the headers taught g2's newer epoch");
  });
});

test("without groups it is one epoch, as before", () => {
  withClient((client, member) => {
    client._accepted(member, trailers(4), A);
    assert.deepEqual(sent(client, B), ["4", undefined]);
    assert.equal(client.epoch, 4);
    assert.throws(() => client._accepted(member, trailers(3), B), LeadershipLostError);
  });
});

const HAPROXY = "/usr/sbin/haproxy";
const ENV = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("SESSIONLOG_")));

function sessionlog(...args) {
  const done = spawnSync(SESSIONLOG_BIN, args, { encoding: "utf8", timeout: 30_000, env: ENV });
  assert.equal(done.status, 0, done.stderr);
  return done.stdout;
}

/** Resolve once port on 127.0.0.1 takes a TCP connection (tried every 50 ms, at most 10 s). */
async function listening(port) {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const open = await new Promise((done) => {
      const socket = connect(port, "127.0.0.1", () => done(true) || socket.end());
      socket.once("error", () => done(false));
    });
    if (open) return;
    assert.ok(Date.now() < deadline, `nothing listens on ${port} within 10 s`);
    await new Promise((done) => setTimeout(done, 50));
  }
}

test("one client through HAProxy writes to two groups at different epochs", async () => {
  assert.ok(existsSync(HAPROXY), "haproxy is not installed: run `make haproxy-tools` (apt-get install haproxy)");
  const root = tempDir("sessionlog-ts-group-epochs-");
  const [pa, pb, ha, hb, proxy, dead] = await Promise.all([...Array(6)].map(() => freePort()));
  const [a, b] = [`127.0.0.1:${pa}`, `127.0.0.1:${pb}`];
  const file = join(root, "shards.toml");
  writeFileSync(
    file,
    `epoch = 1\n[groups.a]\nmembers = ["${a}"]\nslots = ["0-511"]\nhttp = ["127.0.0.1:${ha}"]\n` +
      `[groups.b]\nmembers = ["${b}"]\nslots = ["512-1023"]\nhttp = ["127.0.0.1:${hb}"]\n`,
  );
  const servers = [];
  let haproxy = null;
  const client = new SessionLogClient(`127.0.0.1:${proxy}`, { retry: { giveUpAfterMs: 20_000, initialBackoffMs: 20, maxBackoffMs: 200 } });
  try {
    for (const name of ["a", "b"]) mkdirSync(join(root, name));
    // a: a replica (of nobody) promoted to epoch 5; b: a fresh primary (epoch 1 at its first write).
    const replica = ["--replica-of", `127.0.0.1:${dead}`];
    servers.push(await startServer({ port: pa, root: join(root, "a"), args: ["--shard-map", file, "--http-listen", `127.0.0.1:${ha}`, ...replica] }));
    servers.push(await startServer({ port: pb, root: join(root, "b"), args: ["--shard-map", file, "--http-listen", `127.0.0.1:${hb}`] }));
    assert.equal(JSON.parse(sessionlog("admin", "promote", "--server", a, "--epoch", "5", "--json")).epoch, 5);
    const out = join(root, "proxy");
    sessionlog("cluster", "haproxy", "--shard-map", file, "--out", out, "--bind", `127.0.0.1:${proxy}`, "--timeout", "10", "--check-interval", "0.3");
    const log = openSync(join(root, "haproxy.log"), "a");
    haproxy = spawn(HAPROXY, ["-db", "-f", join(out, "haproxy.cfg")], { stdio: ["ignore", log, log] });
    await listening(proxy);
    const ids = [...Array(200).keys()].map((i) => `epochs-${i}`);
    const inA = ids.find((id) => slotOf(id) < 512);
    const inB = ids.find((id) => slotOf(id) >= 512);
    const user = (content) => ({ type: "user_message", data: { content } });
    for (const round of [1, 2]) {
      for (const id of [inA, inB]) assert.equal((await client.append(id, [user(`${id} ${round}`)])).nextSeq, round);
    }
    assert.equal(client.epoch, 5, "the highest of any group");
    assert.deepEqual(sent(client, inA), ["5", "a"]);
    assert.deepEqual(sent(client, inB), ["1", "b"]);
  } finally {
    client.close();
    if (haproxy && haproxy.exitCode === null) {
      const exited = new Promise((done) => haproxy.once("exit", done));
      haproxy.kill("SIGTERM");
      await exited;
    }
    for (const s of servers) await s.stop();
    for (const s of servers) s.remove();
  }
});
