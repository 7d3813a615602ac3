// The client sends x-session-id (a fork's source id) on every call that names a session, and keeps
// its token: a real grpc-js server here records each call's metadata and refuses the call with
// UNIMPLEMENTED (which no call retries).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

import { SESSION_HEADER, SessionLogClient, sessionHeader } from "sessionlog-client";

const PROTO_DIR = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "proto");
const TOKEN = "secret-token";
const SID = "sess-1";
const SOURCE = "parent.2";

let server;
let address;
const calls = [];

before(async () => {
  const definition = protoLoader.loadSync("sessionlog/v1/session_log_service.proto", {
    includeDirs: [PROTO_DIR],
    keepCase: true,
  });
  const { service } = grpc.loadPackageDefinition(definition).sessionlog.v1.SessionLogService;
  const refusal = { code: grpc.status.UNIMPLEMENTED, details: "recorded" };
  const handlers = {};
  for (const [name, method] of Object.entries(service)) {
    handlers[method.originalName ?? name] = method.responseStream
      ? (call) => {
          calls.push([name, call.metadata]);
          call.emit("error", refusal);
        }
      : (call, callback) => {
          calls.push([name, call.metadata]);
          callback(refusal);
        };
  }
  server = new grpc.Server();
  server.addService(service, handlers);
  const port = await new Promise((done, fail) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (error, bound) =>
      error ? fail(error) : done(bound),
    ),
  );
  address = `127.0.0.1:${port}`;
});

after(() => server?.forceShutdown());

async function drain(iterable) {
  for await (const _ of iterable); // eslint-disable-line no-unused-vars
}

test("every call that names a session carries x-session-id, and the token", async () => {
  const user = { type: "user_message", data: { content: "hi" } };
  const client = new SessionLogClient(address, { token: TOKEN, timeoutMs: 5_000 });
  const expected = [
    ["Append", SID, () => client.append(SID, [user])],
    ["Since", SID, () => drain(client.since(SID, { seq: 3 }))],
    ["Since", SID, () => drain(client.follow(SID))],
    ["Surface", SID, () => client.surface(SID)],
    ["DeriveMessages", SID, () => client.deriveMessages(SID, { atSeq: 2 })],
    ["CreateSession", SID, () => client.createSession(SID)],
    ["SeedSession", SID, () => client.seedSession(SID, [{ role: "user", content: "x" }])],
    ["GetSession", SID, () => client.getSession(SID)],
    ["ForkSession", SOURCE, () => client.forkSession(SOURCE, { sessionId: "child" })],
    ["AcquireLease", SID, () => client.acquireLease(SID, "w1", { ttlMs: 5_000 })],
    ["RenewLease", SID, () => client.renewLease(SID, "w1")],
    ["ReleaseLease", SID, () => client.releaseLease(SID, "w1")],
    ["ListSessions", "", () => drain(client.listSessions({ prefix: "s" }))],
    ["GetSession", "%C5%BC%C3%B3%C5%82w", () => client.getSession("żółw")],
  ];
  try {
    for (const [method, , call] of expected) {
      await assert.rejects(call(), (error) => error.code === grpc.status.UNIMPLEMENTED, method);
    }
  } finally {
    client.close();
  }
  assert.deepEqual(
    calls.map(([name]) => name),
    expected.map(([name]) => name),
  );
  calls.forEach(([name, metadata], i) => {
    const header = metadata.get(SESSION_HEADER);
    assert.deepEqual(header, expected[i][1] ? [expected[i][1]] : [], name);
    assert.deepEqual(metadata.get("authorization"), [`Bearer ${TOKEN}`], name);
  });
  assert.equal(sessionHeader("Abc_9.x-y"), "Abc_9.x-y");
});
