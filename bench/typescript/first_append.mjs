// The Claude store's first append to a session, two builds of the TypeScript client interleaved
// in one run against one real server: each turn appends one entry to APPENDS sessions with a
// store that never saw them, old then new, PAIRS times; the sessions are new, then (a second
// table) each already holds an entry another store wrote (a resumed session). Prints each
// build's median per append, its spread (min..max of the turns' medians) and the new/old ratio.
//
//   node bench/typescript/first_append.mjs OLD_LIB [NEW_LIB] [PAIRS] [APPENDS]
//
// OLD_LIB as for whole_reads.mjs.
import { dirname, join, resolve } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";

import { startServer } from "../../client/typescript/test/server.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const [oldLib, newLib = join(HERE, "..", "..", "client", "typescript", "lib"), pairs = "8", appends = "40"] =
  process.argv.slice(2);
if (!oldLib) throw new Error("usage: first_append.mjs OLD_LIB [NEW_LIB] [PAIRS] [APPENDS]");
const PAIRS = Number(pairs);
const APPENDS = Number(appends);

/** A stand-in for the SDK's foldSessionSummary (the store passes it through). */
const fold = (prev, key, entries) => ({
  sessionId: key.sessionId,
  mtime: 0,
  data: { ...(prev?.data ?? {}), count: (prev?.data?.count ?? 0) + entries.length },
});

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const server = await startServer();
try {
  const clients = [];
  const stores = {};
  for (const [name, lib] of [["old", oldLib], ["new", newLib]]) {
    const folder = resolve(lib);
    const { SessionLogClient } = await import(join(folder, "index.js"));
    const { SessionlogSessionStore } = await import(join(folder, "claude-agent-sdk.js"));
    const client = new SessionLogClient(server.address, { protoDir: resolve(folder, "..", "..", "..", "proto") });
    clients.push(client);
    stores[name] = () => new SessionlogSessionStore(client, { prefix: `bench-${name}.`, foldSessionSummary: fold });
  }
  let next = 0;
  const entry = () => ({ type: "user", uuid: `u-${next++}`, timestamp: "2026-12-07T00:00:00.000Z", message: { role: "user", content: "hi" } });
  const turn = async (name, resumed) => {
    const times = [];
    for (let n = 0; n < APPENDS; n++) {
      const key = { projectKey: "bench", sessionId: `s${next++}` };
      if (resumed) await stores[name]().append(key, [entry()]);
      const store = stores[name]();
      const started = performance.now();
      await store.append(key, [entry()]);
      times.push(performance.now() - started);
    }
    return median(times);
  };
  const ms = (x) => x.toFixed(2);
  const spread = (xs) => `${ms(median(xs))} (${ms(Math.min(...xs))}..${ms(Math.max(...xs))})`;
  for (const resumed of [false, true]) {
    const turns = { old: [], new: [] };
    await turn("old", resumed);
    await turn("new", resumed); // warm up
    for (let pair = 0; pair < PAIRS; pair++) {
      for (const name of ["old", "new"]) turns[name].push(await turn(name, resumed));
    }
    const what = resumed ? "a session holding an entry" : "a new session";
    console.log(`first append to ${what}, ${PAIRS} pairs (old, new interleaved), each turn the median of ${APPENDS}; ms`);
    console.log(`old ${spread(turns.old)}, new ${spread(turns.new)}, new/old ${(median(turns.new) / median(turns.old)).toFixed(2)}`);
  }
  for (const client of clients) client.close();
} finally {
  await server.stop();
  server.remove();
}
