// The Node client against a real `sessionlog serve`: every wrapped RPC, errors with reason and
// metadata, follow (live, close, break, and across a server restart), and the chat format.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { describe, test } from "node:test";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import * as grpc from "@grpc/grpc-js";
import protobuf from "protobufjs";

import {
  LeadershipLostError,
  NotPrimaryError,
  ReplicasUnavailableError,
  SessionLogClient,
  SessionLogError,
  eventFromMessage,
  toError,
} from "sessionlog-client";

import { freePort, startServer, tempDir, useServer } from "./server.mjs";

const PACKAGE = join(dirname(fileURLToPath(import.meta.url)), "..");
const FAST = { giveUpAfterMs: 20_000, initialBackoffMs: 20, maxBackoffMs: 200 };
const user = (content) => ({ type: "user_message", data: { content } });

async function collect(stream, count, ms = 15_000) {
  const seen = [];
  const timer = setTimeout(() => stream.close(), ms);
  try {
    for await (const event of stream) {
      seen.push(event);
      if (seen.length >= count) break;
    }
  } finally {
    clearTimeout(timer);
  }
  return seen;
}

/** A grpc-js error as a sessionlog server sends it: a status with one ErrorInfo detail. */
function refusal(code, reason, metadata) {
  const root = protobuf.Root.fromJSON({
    nested: {
      Any: { fields: { type_url: { type: "string", id: 1 }, value: { type: "bytes", id: 2 } } },
      Status: {
        fields: {
          code: { type: "int32", id: 1 },
          message: { type: "string", id: 2 },
          details: { rule: "repeated", type: "Any", id: 3 },
        },
      },
      ErrorInfo: {
        fields: {
          reason: { type: "string", id: 1 },
          domain: { type: "string", id: 2 },
          metadata: { keyType: "string", type: "string", id: 3 },
        },
      },
    },
  });
  const info = root.lookupType("ErrorInfo").encode({ reason, domain: "sessionlog", metadata }).finish();
  const detail = { type_url: "type.googleapis.com/google.rpc.ErrorInfo", value: info };
  const status = root.lookupType("Status").encode({ code, message: "refused", details: [detail] }).finish();
  const trailers = new grpc.Metadata();
  trailers.add("grpc-status-details-bin", Buffer.from(status));
  return Object.assign(new Error("refused"), { code, details: "refused", metadata: trailers });
}

test("NOT_PRIMARY, LEADERSHIP_LOST and REPLICAS_UNAVAILABLE become errors of their own class", () => {
  const replicas = toError(refusal(grpc.status.UNAVAILABLE, "REPLICAS_UNAVAILABLE", { needed: "2", counted: "1", position: "41" }));
  assert.ok(replicas instanceof ReplicasUnavailableError && replicas instanceof SessionLogError);
  assert.deepEqual([replicas.needed, replicas.counted, replicas.position, replicas.codeName], [2, 1, 41, "UNAVAILABLE"]);
  const lost = toError(refusal(grpc.status.UNAVAILABLE, "LEADERSHIP_LOST", { committed: "True" }));
  assert.ok(lost instanceof LeadershipLostError);
  assert.equal(lost.committed, true);
  const notPrimary = toError(refusal(grpc.status.FAILED_PRECONDITION, "NOT_PRIMARY", { primary: "10.0.0.2:1", epoch: "3" }));
  assert.ok(notPrimary instanceof NotPrimaryError);
  assert.deepEqual([notPrimary.primary, notPrimary.epoch, notPrimary.reason], ["10.0.0.2:1", 3, "NOT_PRIMARY"]);
  const other = toError(refusal(grpc.status.ABORTED, "SEQ_CONFLICT", { next_seq: "4" }));
  assert.equal(other.constructor, SessionLogError);
  assert.deepEqual([other.reason, other.metadata.next_seq], ["SEQ_CONFLICT", "4"]);
});

describe("against one server", () => {
  const live = useServer({ clientOptions: { retry: FAST } });

  test("SPEC §4's third example: surface and messages after a summary", async () => {
    const first = await live.client.append("demo", [
      { type: "system_message", data: { content: "sys" } },
      user("a"),
      { type: "assistant_message", data: { content: "b" } },
      user("c"),
    ]);
    assert.deepEqual(first.events.map((e) => e.seq), [0, 1, 2, 3]);
    assert.equal(first.nextSeq, 4);
    const summary = await live.client.append(
      "demo",
      [{ type: "system_message", data: { content: "[summary]" }, replace: [1, 2] }],
      { expectedSeq: 4 },
    );
    assert.deepEqual(summary.events[0].replace, [1, 2]);
    const since = [];
    for await (const event of live.client.since("demo", { seq: 3 })) since.push(event.seq);
    assert.deepEqual(since, [3, 4]);
    const surface = await live.client.surface("demo");
    assert.deepEqual(surface.events.map((e) => e.seq), [0, 4, 3]);
    assert.equal(surface.replaceGeneration, 1);
    const derived = await live.client.deriveMessages("demo");
    assert.deepEqual(derived.messages.map((m) => m.content), ["sys", "[summary]", "c"]);
    assert.deepEqual(derived.seqs, [0, 4, 3]);
    const before = await live.client.deriveMessages("demo", { atSeq: 3 });
    assert.deepEqual(before.messages.map((m) => m.role), ["system", "user", "assistant", "user"]);
  });

  test("refusals carry the ErrorInfo reason and metadata", async () => {
    await live.client.append("err", [user("one")]);
    await assert.rejects(live.client.append("err", [user("two")], { expectedSeq: 0 }), (error) => {
      assert.ok(error instanceof SessionLogError);
      assert.equal(error.reason, "SEQ_CONFLICT");
      assert.equal(error.codeName, "ABORTED");
      assert.equal(error.domain, "sessionlog");
      assert.equal(error.metadata.next_seq, "1");
      return true;
    });
    await assert.rejects(live.client.getSession("not valid!"), { reason: "INVALID_SESSION_ID" });
    await assert.rejects(live.client.append("err", [{ type: "tool_call", data: {}, replace: [0, 0] }]), {
      reason: "SURFACE_OP_ON_NON_SURFACE_EVENT",
    });
    await assert.rejects(live.client.surface("err", { atSeq: 7 }), { reason: "BOUNDARY_OUT_OF_RANGE" });
  });

  test("an explicit requestId makes a repeated append a replay", async () => {
    const first = await live.client.append("idem", [user("x")], { requestId: "r-1" });
    const again = await live.client.append("idem", [user("x")], { requestId: "r-1" });
    assert.equal(again.nextSeq, first.nextSeq);
    await assert.rejects(live.client.append("idem", [user("y")], { requestId: "r-1" }), {
      reason: "REQUEST_ID_REUSED",
    });
  });

  test("follow yields stored then live events, and close() ends it", async () => {
    await live.client.append("live", [user("0"), user("1")]);
    const stream = live.client.follow("live");
    const seen = collect(stream, 4);
    await new Promise((done) => setTimeout(done, 100));
    await live.client.append("live", [user("2")]);
    await live.client.append("live", [user("3")]);
    assert.deepEqual((await seen).map((e) => e.seq), [0, 1, 2, 3]);
    assert.equal(stream.caughtUp, true);
    assert.equal(stream.nextSeq, 4);

    const closing = live.client.follow("live", { seq: 4 });
    const started = Date.now();
    const pending = collect(closing, 1);
    setTimeout(() => closing.close(), 100);
    assert.deepEqual(await pending, []);
    assert.ok(Date.now() - started < 5_000, "close() did not end the stream");
    assert.equal(closing.closed, true);
  });

  test("since().batches() yields the events a reply at a time, in order, none empty", async () => {
    const many = Array.from({ length: 3000 }, (_, i) => user(`event ${i} `.padEnd(120, "x")));
    await live.client.append("batched", many);
    const stream = live.client.since("batched");
    const batches = [];
    for await (const batch of stream.batches()) batches.push(batch);
    assert.ok(batches.length > 1, `3000 events of 120 bytes in more than one reply: ${batches.length}`);
    assert.ok(batches.every((batch) => Array.isArray(batch) && batch.length > 0));
    const events = batches.flat();
    assert.deepEqual(events.map((e) => e.seq), many.map((_, i) => i));
    assert.equal(events[2999].data.content, many[2999].data.content);
    assert.equal(stream.nextSeq, 3000);
    assert.equal(stream.closed, true);
    const one = [];
    for await (const event of live.client.since("batched", { seq: 2990 })) one.push(event);
    assert.deepEqual(one, events.slice(2990), "the event iterator reads the same events");
  });

  test("follow().batches() yields stored then live batches, and close() ends it", async () => {
    await live.client.append("live-batches", [user("0"), user("1")]);
    const stream = live.client.follow("live-batches");
    const seen = [];
    const reading = (async () => {
      for await (const batch of stream.batches()) {
        seen.push(batch.map((e) => e.seq));
        if (seen.flat().length >= 5) stream.close();
      }
    })();
    while (!stream.caughtUp) await new Promise((done) => setTimeout(done, 10));
    await live.client.append("live-batches", [user("2"), user("3"), user("4")]);
    await reading;
    assert.deepEqual(seen, [[0, 1], [2, 3, 4]]);
    assert.equal(stream.closed, true);
  });

  test("closing the client ends the streams it opened", async () => {
    const other = new SessionLogClient(live.server.address);
    const stream = other.follow("live", { seq: 4 });
    const started = Date.now();
    const pending = collect(stream, 1);
    setTimeout(() => other.close(), 100);
    assert.deepEqual(await pending, []);
    assert.ok(Date.now() - started < 5_000, "client.close() did not end the stream");
    assert.equal(stream.closed, true);
  });

  test("lifecycle: a repeated requestId replays create, seed and fork", async () => {
    const first = await live.client.createSession("rid-1", [user("a")], { requestId: "c-1" });
    const again = await live.client.createSession("rid-1", [user("a")], { requestId: "c-1" });
    assert.deepEqual(again, first);
    await assert.rejects(live.client.createSession("rid-1", [user("b")], { requestId: "c-1" }), {
      reason: "REQUEST_ID_REUSED",
    });
    const seed = [{ role: "user", content: "hi" }];
    const seeded = await live.client.seedSession("rid-2", seed, { requestId: "s-1" });
    assert.deepEqual(await live.client.seedSession("rid-2", seed, { requestId: "s-1" }), seeded);
    const fork = await live.client.forkSession("rid-1", { requestId: "f-1" });
    assert.match(fork.session.sessionId, /^fork-/);
    assert.equal((await live.client.forkSession("rid-1", { requestId: "f-1" })).session.sessionId, fork.session.sessionId);
    await assert.rejects(live.client.createSession("rid-1", [user("a")], { requestId: "" }), {
      reason: "SESSION_ALREADY_EXISTS",
    });
  });

  test("lifecycle: create, seed, get, list, fork and the lease", async () => {
    const created = await live.client.createSession("life-1", [user("hello")]);
    assert.equal(created.session.eventCount, 1);
    await assert.rejects(live.client.createSession("life-1"), { reason: "SESSION_ALREADY_EXISTS" });
    const seeded = await live.client.seedSession("life-2", [
      { role: "system", content: "s", created_at: "2026-01-02T03:04:05.123456Z" },
      { role: "robot", content: "?" },
    ]);
    assert.deepEqual(seeded.drops, [{ index: 1, reason: "UNKNOWN_ROLE" }]);
    assert.equal(seeded.events[0].time, "2026-01-02T03:04:05.123456Z");
    await live.client.createSession("life-3");
    const pages = [];
    for await (const page of live.client.listSessions({ prefix: "life-", pageSize: 2 })) pages.push(page);
    assert.deepEqual(
      pages.map((p) => p.sessions.map((s) => s.sessionId)),
      [["life-1", "life-2"], ["life-3"]],
    );
    const fork = await live.client.forkSession("life-1", { atSeq: 0, sessionId: "life-fork" });
    assert.equal(fork.session.parentSessionId, "life-1");
    assert.equal((await live.client.getSession("never")).session.exists, false);

    const { lease } = await live.client.acquireLease("life-1", "node-1", { ttlMs: 30_000 });
    assert.equal(lease.holder, "node-1");
    await assert.rejects(live.client.append("life-1", [user("intruder")]), { reason: "LEASE_HELD" });
    await live.client.append("life-1", [user("mine")], { leaseHolder: "node-1", leaseToken: lease.token });
    const renewed = await live.client.renewLease("life-1", "node-1", { ttlMs: 60_000 });
    assert.equal(renewed.lease.token, lease.token);
    const released = await live.client.releaseLease("life-1", "node-1");
    assert.equal(released.released.token, lease.token);
    assert.equal((await live.client.getSession("life-1")).session.lease, undefined);
  });

  test("chat-format messages round-trip through seed and deriveMessages", async () => {
    const chat = [
      { role: "system", content: "Be brief." },
      { role: "user", content: [{ type: "text", text: "look" }] },
      { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: "{}" } }] },
      { role: "tool", content: "42", tool_call_id: "c1", name: "f" },
    ];
    await live.client.seedSession("chat", chat);
    assert.deepEqual((await live.client.deriveMessages("chat")).messages, chat);
    await live.client.append("chat", [eventFromMessage({ role: "assistant", content: "done" })]);
    const { messages } = await live.client.deriveMessages("chat", { extra: true });
    assert.equal(messages.at(-1).content, "done");
    assert.match(messages.at(-1).created_at, /^\d{4}-\d\d-\d\dT/);
  });

  test("example.mjs runs against the server", () => {
    const result = spawnSync(process.execPath, ["example.mjs", live.server.address, "example-test"], {
      cwd: PACKAGE,
      encoding: "utf8",
      timeout: 30_000,
    });
    assert.equal(result.status, 0, result.stderr);
    assert.match(result.stdout, /event 3 system_message replaces 1\.\.2/);
    assert.match(result.stdout, /message from seq 3: system: \[summary\] LMDB explained\./);
    assert.match(result.stdout, /refused: SEQ_CONFLICT, next_seq 4/);
  });
});

test("a wrong address rejects at once, naming it", async () => {
  const port = await freePort();
  const address = `127.0.0.1:${port}`;
  const client = new SessionLogClient(address, { retry: { giveUpAfterMs: 30_000 } });
  const started = Date.now();
  try {
    await assert.rejects(client.append("s", [user("lost")]), (error) => {
      assert.equal(error.reason, "UNAVAILABLE");
      assert.match(error.message, new RegExp(`cannot reach a sessionlog server at ${address}`));
      return true;
    });
    await assert.rejects(collect(client.follow("s"), 1), { reason: "UNAVAILABLE" });
  } finally {
    client.close();
  }
  assert.ok(Date.now() - started < 2_000, "waited instead of failing fast");
});

test("a silent address rejects after connectTimeoutMs, naming it", async () => {
  const sockets = new Set();
  const silent = createServer((socket) => sockets.add(socket)); // accepts TCP, never speaks HTTP/2
  await new Promise((done) => silent.listen(0, "127.0.0.1", done));
  const address = `127.0.0.1:${silent.address().port}`;
  const client = new SessionLogClient(address, { connectTimeoutMs: 500 });
  const started = Date.now();
  try {
    await assert.rejects(client.getSession("s"), (error) => {
      assert.equal(error.reason, "UNAVAILABLE");
      assert.match(error.message, new RegExp(`no connection .* at ${address} within 0.5 s`));
      return true;
    });
  } finally {
    client.close();
    for (const socket of sockets) socket.destroy();
    silent.close();
  }
  const took = Date.now() - started;
  assert.ok(took >= 400 && took < 3_000, `took ${took} ms`);
});

test("after first contact, a gone server is retried for the budget", async () => {
  const server = await startServer();
  const client = new SessionLogClient(server.address, { retry: { giveUpAfterMs: 300 } });
  try {
    await client.getSession("s");
    assert.equal(await server.stop(), 0);
    const started = Date.now();
    await assert.rejects(client.append("s", [user("lost")]), { reason: "UNAVAILABLE", codeName: "UNAVAILABLE" });
    assert.ok(Date.now() - started >= 250, "gave up before the budget");
  } finally {
    client.close();
    server.remove();
  }
});

test("follow survives a server restart with no gap and no duplicate", async () => {
  const root = tempDir();
  let server = await startServer({ root });
  const { port } = server;
  const client = new SessionLogClient(server.address, { retry: FAST });
  try {
    const stream = client.follow("restart");
    const seen = collect(stream, 6, 30_000);
    await client.append("restart", [user("0"), user("1"), user("2")]);
    while (stream.nextSeq < 3) await new Promise((done) => setTimeout(done, 10));
    assert.equal(await server.stop(), 0);
    server = await startServer({ root, port });
    await client.append("restart", [user("3")]);
    await client.append("restart", [user("4"), user("5")]);
    const events = await seen;
    assert.deepEqual(events.map((e) => e.seq), [0, 1, 2, 3, 4, 5]);
    assert.deepEqual(events.map((e) => e.data.content), ["0", "1", "2", "3", "4", "5"]);
    assert.ok(stream.reconnects >= 1);
  } finally {
    client.close();
    await server.stop();
    server.remove();
  }
});

test("follow().batches() survives a server restart with no gap and no duplicate", async () => {
  const root = tempDir();
  let server = await startServer({ root });
  const { port } = server;
  const client = new SessionLogClient(server.address, { retry: FAST });
  try {
    const stream = client.follow("restart-batches");
    const seen = [];
    const reading = (async () => {
      for await (const batch of stream.batches()) {
        seen.push(...batch);
        if (seen.length >= 6) break;
      }
    })();
    await client.append("restart-batches", [user("0"), user("1"), user("2")]);
    while (stream.nextSeq < 3) await new Promise((done) => setTimeout(done, 10));
    assert.equal(await server.stop(), 0);
    server = await startServer({ root, port });
    await client.append("restart-batches", [user("3")]);
    await client.append("restart-batches", [user("4"), user("5")]);
    const timer = setTimeout(() => stream.close(), 30_000);
    await reading;
    clearTimeout(timer);
    assert.deepEqual(seen.map((e) => e.seq), [0, 1, 2, 3, 4, 5]);
    assert.ok(stream.reconnects >= 1);
    assert.equal(stream.closed, true);
  } finally {
    client.close();
    await server.stop();
    server.remove();
  }
});

test("TLS and a bearer token reach a server that requires both", async () => {
  const root = tempDir();
  const made = spawnSync(
    "openssl",
    ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
      "-subj", "/CN=localhost", "-keyout", "server.key", "-out", "server.crt",
      "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
    { cwd: root, encoding: "utf8", timeout: 30_000 },
  );
  assert.equal(made.status, 0, made.stderr);
  const token = "n0de-n0de-n0de-n0de";
  writeFileSync(join(root, "tokens.toml"), `[[token]]\nname = "node"\ntoken = "${token}"\npermissions = ["read", "write"]\n`);
  const rootCerts = readFileSync(join(root, "server.crt"));
  const args = ["--tls-cert", join(root, "server.crt"), "--tls-key", join(root, "server.key"), "--auth-tokens", join(root, "tokens.toml")];
  const server = await startServer({ root, args, clientOptions: { rootCerts, token } });
  const client = new SessionLogClient(server.address, { rootCerts, token });
  const anonymous = new SessionLogClient(server.address, { rootCerts, retry: { giveUpAfterMs: 0 } });
  const plaintext = new SessionLogClient(server.address, { token, retry: { giveUpAfterMs: 0 } });
  try {
    await client.append("secure", [user("over TLS")]);
    assert.deepEqual((await client.deriveMessages("secure")).messages, [{ role: "user", content: "over TLS" }]);
    await assert.rejects(anonymous.getSession("secure"), { reason: "UNAUTHENTICATED" });
    await assert.rejects(plaintext.getSession("secure"), { reason: "UNAVAILABLE" });
  } finally {
    client.close();
    anonymous.close();
    plaintext.close();
    await server.stop();
    server.remove();
  }
});
