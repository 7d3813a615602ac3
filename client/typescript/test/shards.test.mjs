// Smart routing (option shardMap: "server") over two static groups of real `sessionlog serve
// --shard-map FILE` servers: each call goes to the owner of its session; after the servers
// restart with a newer map, a call routed by the old one is refused WRONG_GROUP, the map reloaded
// and the call sent to the new owner once; an open follow goes on there.
import assert from "node:assert/strict";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, test } from "node:test";

import { SessionLogClient, ShardTable, afterWrongGroup, slotOf } from "sessionlog-client";

import { freePort, startServer, tempDir } from "./server.mjs";

const user = (content) => ({ type: "user_message", data: { content } });
const servers = [];
after(async () => {
  for (const s of servers) await s.stop();
  for (const s of servers) s.remove();
});

function mapToml(epoch, a, b, moved = -1) {
  const slots = (ranges) => ranges.map(([f, l]) => (f === l ? `"${f}"` : `"${f}-${l}"`)).join(", ");
  let aRanges = [[0, 511]];
  let bRanges = [[512, 1023]];
  if (moved >= 0) {
    aRanges = [[0, moved - 1], [moved + 1, 511]].filter(([f, l]) => f <= l);
    bRanges = [[moved, moved], ...bRanges];
  }
  return `epoch = ${epoch}\n[groups.a]\nmembers = ["${a}"]\nslots = [${slots(aRanges)}]\n[groups.b]\nmembers = ["${b}"]\nslots = [${slots(bRanges)}]\n`;
}

test("the slots and the table agree with the server's (crc32 of the UTF-8 id mod 1024)", () => {
  // zlib.crc32(id.encode()) % 1024 in Python, the server's slot_of.
  assert.deepEqual(["demo", "żółw", "route-1", "日本語-9"].map(slotOf), [928, 478, 153, 866]);
  const table = ShardTable.fromJson('{"epoch":2,"groups":{"a":{"members":["h:1"],"slots":["0-511"]},"b":{"members":["h:2"],"slots":["512-1023"]}}}');
  assert.equal(table.owner("demo").name, "b");
  const { table: moved, owner } = afterWrongGroup(table, null, "demo", { group: "a", primary: "h:9", members: "h:1,h:9", map_epoch: "3" });
  assert.equal(owner.primary, "h:9");
  assert.equal(moved.epoch, 3);
  assert.equal(moved.owner("demo").name, "a");
  assert.equal(moved.owner("route-1").name, "a");
  assert.throws(() => new ShardTable(1, [{ name: "a", members: ["h:1"], ranges: [[0, 10]], primary: "" }]), /no owner/);
});

test("a stale server's WRONG_GROUP does not undo a newer map", () => {
  // The client holds epoch 5 (demo is b's); b, still at epoch 4, refuses naming a.
  const table = ShardTable.fromJson('{"epoch":5,"groups":{"a":{"members":["h:1"],"slots":["0-511"]},"b":{"members":["h:2"],"slots":["512-1023"]}}}');
  const stale = { group: "a", primary: "h:1", members: "h:1", map_epoch: "4" };
  const kept = afterWrongGroup(table, null, "demo", stale);
  assert.equal(kept.table, table);
  assert.equal(kept.owner.name, "b");
  const fresh = afterWrongGroup(table, null, "demo", { ...stale, map_epoch: "6" });
  assert.equal(fresh.owner.name, "a");
  assert.equal(fresh.table.epoch, 6);
});

test("calls go to the owner's primary, and a WRONG_GROUP reroutes once", async () => {
  const root = tempDir("sessionlog-ts-shards-");
  const [pa, pb] = [await freePort(), await freePort()];
  const [a, b] = [`127.0.0.1:${pa}`, `127.0.0.1:${pb}`];
  const start = async (epoch, moved) => {
    const file = join(root, `shards-${epoch}.toml`);
    writeFileSync(file, mapToml(epoch, a, b, moved));
    servers.length = 0;
    const both = [["a", pa], ["b", pb]].map(([name, port]) => {
      mkdirSync(join(root, name), { recursive: true });
      return startServer({ port, root: join(root, name), args: ["--shard-map", file] });
    });
    servers.push(...(await Promise.all(both)));
  };
  const ids = (pred) => [...Array(2000).keys()].map((i) => `route-${i}`).filter((id) => pred(slotOf(id)));
  const [inA, moving] = ids((slot) => slot < 512 && slot > 0);
  const [inB] = ids((slot) => slot >= 512);
  await start(1, -1);
  const client = new SessionLogClient(a, { shardMap: "server", retry: { giveUpAfterMs: 20_000, initialBackoffMs: 20, maxBackoffMs: 200 } });
  const plainB = new SessionLogClient(b, { retry: { wrongGroupForMs: 0 } }); // WRONG_GROUP at once
  try {
    for (const id of [inA, inB, moving]) await client.append(id, [user("hi")]);
    assert.equal((await client.shardMap()).epoch, 1);
    assert.equal((await plainB.getSession(inB)).session.eventCount, 1);
    await assert.rejects(plainB.getSession(inA), (error) => error.reason === "WRONG_GROUP" && error.metadata.primary === a);
    const stream = client.follow(moving)[Symbol.asyncIterator]();
    assert.equal((await stream.next()).value.seq, 0);

    await Promise.all(servers.map((s) => s.stop()));
    await start(2, slotOf(moving));
    const reply = await client.append(moving, [user("again")]); // to a by the old map, then b
    assert.equal(reply.events[0].seq, 0);
    assert.equal((await client.shardMap()).epoch, 2);
    assert.equal((await plainB.getSession(moving)).session.eventCount, 1);
    await client.append(moving, [user("more")]);
    assert.equal((await stream.next()).value.seq, 1); // the follow went on at b from seq 1
    await stream.return();
    assert.equal((await client.getSession(inA)).session.eventCount, 1);
  } finally {
    client.close();
    plainB.close();
    await Promise.all(servers.splice(0).map((s) => s.stop()));
    rmSync(root, { recursive: true, force: true });
  }
});

test("a plain client waits out WRONG_GROUP until the slot's new owner takes the call", async () => {
  // As behind HAProxy after a move's flip, before haproxy-sync applied the new map: the call
  // reaches the old owner, is refused WRONG_GROUP (nothing written), and is sent again.
  const root = tempDir("sessionlog-ts-shards-wait-");
  const [pa, pb] = [await freePort(), await freePort()];
  const [a, b] = [`127.0.0.1:${pa}`, `127.0.0.1:${pb}`];
  const started = [];
  const start = async (epoch, moved) => {
    const file = join(root, `shards-${epoch}.toml`);
    writeFileSync(file, mapToml(epoch, a, b, moved));
    const both = [["a", pa], ["b", pb]].map(([name, port]) => {
      mkdirSync(join(root, name), { recursive: true });
      return startServer({ port, root: join(root, name), args: ["--shard-map", file] });
    });
    started.splice(0, started.length, ...(await Promise.all(both)));
  };
  const [moving] = [...Array(2000).keys()].map((i) => `wait-${i}`).filter((id) => slotOf(id) < 512 && slotOf(id) > 0);
  await start(1, -1);
  const retry = { giveUpAfterMs: 30_000, wrongGroupForMs: 30_000, initialBackoffMs: 20, maxBackoffMs: 200 };
  const patient = new SessionLogClient(b, { retry });
  const brief = new SessionLogClient(b, { retry: { ...retry, wrongGroupForMs: 300 } });
  try {
    const t0 = Date.now();
    await assert.rejects(brief.append(moving, [user("no")]), (error) => error.reason === "WRONG_GROUP");
    assert.ok(Date.now() - t0 >= 250, "WRONG_GROUP was retried for wrongGroupForMs");
    const waiting = patient.append(moving, [user("patient")]);
    await new Promise((done) => setTimeout(done, 500)); // refused WRONG_GROUP meanwhile
    await Promise.all(started.map((s) => s.stop()));
    await start(2, slotOf(moving)); // the slot now b's
    const reply = await waiting;
    assert.equal(reply.events[0].seq, 0);
    const plainB = new SessionLogClient(b);
    assert.equal((await plainB.getSession(moving)).session.eventCount, 1);
    plainB.close();
  } finally {
    patient.close();
    brief.close();
    await Promise.all(started.map((s) => s.stop()));
    rmSync(root, { recursive: true, force: true });
  }
});
