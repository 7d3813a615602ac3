// Whole reads of the TypeScript framework stores, two builds of the client interleaved in one
// run: the Claude store's load() and the OpenAI session's getItems() of one session of ENTRIES
// items, old then new, PAIRS times, against one real server. Prints each build's median, its
// spread (min..max) and the new/old ratio of the medians, for the wall time of a read and for
// this process's CPU time during it (the client's work alone: the server is another process,
// so on a busy machine that is the steadier number).
//
//   (cd client/typescript && npm run build)                    # the new build, in lib/
//   node bench/typescript/whole_reads.mjs OLD_LIB [NEW_LIB] [PAIRS] [ENTRIES]
//
// OLD_LIB is another build's lib/ (e.g. `git archive` of the base commit's client/typescript
// and proto/ into a folder, node_modules linked in, `tsc -p tsconfig.build.json`); each build
// reads the proto/ folder two levels above its lib/'s package.
import { dirname, join, resolve } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";

import { startServer } from "../../client/typescript/test/server.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const [oldLib, newLib = join(HERE, "..", "..", "client", "typescript", "lib"), pairs = "8", entries = "5000"] =
  process.argv.slice(2);
if (!oldLib) throw new Error("usage: whole_reads.mjs OLD_LIB [NEW_LIB] [PAIRS] [ENTRIES]");
const PAIRS = Number(pairs);
const ENTRIES = Number(entries);
const READS = 5; // whole reads per turn; the turn's time is their median

async function build(lib) {
  const folder = resolve(lib);
  return {
    folder,
    protoDir: resolve(folder, "..", "..", "..", "proto"),
    index: await import(join(folder, "index.js")),
    claude: await import(join(folder, "claude-agent-sdk.js")),
    openai: await import(join(folder, "openai-agents.js")),
  };
}

const text = (i) => `turn ${i}: ${"lorem ipsum dolor sit amet ".repeat(6)}`;
const claudeEntry = (i) => ({
  type: i % 2 ? "assistant" : "user",
  uuid: `u-${i}`,
  timestamp: "2026-12-07T00:00:00.000Z",
  message: { role: i % 2 ? "assistant" : "user", content: [{ type: "text", text: text(i) }] },
});
const openaiItem = (i) =>
  i % 2
    ? { type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: text(i) }] }
    : { type: "message", role: "user", content: text(i) };

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** The median wall and CPU ms of READS reads. */
async function timed(read) {
  const wall = [];
  const cpu = [];
  for (let n = 0; n < READS; n++) {
    const started = performance.now();
    const used = process.cpuUsage();
    const got = await read();
    const spent = process.cpuUsage(used);
    wall.push(performance.now() - started);
    cpu.push((spent.user + spent.system) / 1000);
    if (got.length !== ENTRIES) throw new Error(`read ${got.length} of ${ENTRIES}`);
  }
  return { wall: median(wall), cpu: median(cpu) };
}

const server = await startServer();
try {
  const builds = { old: await build(oldLib), new: await build(newLib) };
  const clients = {};
  for (const [name, b] of Object.entries(builds)) {
    clients[name] = new b.index.SessionLogClient(server.address, { protoDir: b.protoDir });
  }
  // Written once, with the new build; both read the same sessions.
  const writer = new builds.new.claude.SessionlogSessionStore(clients.new, { prefix: "bench." });
  const key = { projectKey: "bench", sessionId: "whole" };
  const session = new builds.new.openai.SessionlogSession("bench-openai", clients.new);
  for (let at = 0; at < ENTRIES; at += 500) {
    const upto = Math.min(at + 500, ENTRIES);
    await writer.append(key, Array.from({ length: upto - at }, (_, i) => claudeEntry(at + i)));
    await session.addItems(Array.from({ length: upto - at }, (_, i) => openaiItem(at + i)));
  }
  const reads = {};
  for (const [name, b] of Object.entries(builds)) {
    const store = new b.claude.SessionlogSessionStore(clients[name], { prefix: "bench." });
    const items = new b.openai.SessionlogSession("bench-openai", clients[name]);
    reads[name] = { "Claude load": () => store.load(key), "OpenAI getItems": () => items.getItems() };
    for (const read of Object.values(reads[name])) await read(); // warm up
  }
  const times = { old: {}, new: {} };
  for (let pair = 0; pair < PAIRS; pair++) {
    for (const name of ["old", "new"]) {
      for (const [what, read] of Object.entries(reads[name])) {
        (times[name][what] ??= []).push(await timed(read));
      }
    }
  }
  const ms = (x) => x.toFixed(1);
  const spread = (xs) => `${ms(median(xs))} (${ms(Math.min(...xs))}..${ms(Math.max(...xs))})`;
  console.log(`${ENTRIES} entries, ${PAIRS} pairs (old, new interleaved), each turn the median of ${READS} reads; ms`);
  for (const what of Object.keys(times.old)) {
    for (const measure of ["wall", "cpu"]) {
      const [a, b] = [times.old[what].map((t) => t[measure]), times.new[what].map((t) => t[measure])];
      console.log(`${what}, ${measure}: old ${spread(a)}, new ${spread(b)}, new/old ${(median(b) / median(a)).toFixed(2)}`);
    }
  }
  for (const client of Object.values(clients)) client.close();
} finally {
  await server.stop();
  server.remove();
}
