// Real `sessionlog serve` processes for the tests: a free port, a temp data folder, readiness by
// connecting, and stop by PID (SIGTERM, then SIGKILL if it hangs). useServer() gives a describe
// block one server and one client.
import { spawn } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { after, before } from "node:test";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { SessionLogClient } from "sessionlog-client";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
/** The server binary: $SESSIONLOG_BIN (the Python test passes its venv's), else .venv's. */
export const SESSIONLOG_BIN = process.env.SESSIONLOG_BIN ?? join(ROOT, ".venv", "bin", "sessionlog");

// A port on 127.0.0.1 that was free a moment ago, picked at random below Linux's ephemeral
// range (32768 and up): a port from listen(0) is free again once the probe closes, and any
// later listen(0) or outgoing connection on the machine may take it before the server meant
// for it binds it. Below that range only another pick like this one can (tests/e2e/_proc.py's
// free_port does the same).
function probePort(port) {
  return new Promise((done) => {
    const probe = createServer();
    probe.once("error", () => done(false));
    probe.listen(port, "127.0.0.1", () => probe.close(() => done(true)));
  });
}

export async function freePort() {
  for (let tries = 0; tries < 200; tries++) {
    const port = 20768 + Math.floor(Math.random() * 12000);
    if (await probePort(port)) return port;
  }
  throw new Error("no free port on 127.0.0.1 in 20768-32767");
}

export function tempDir(prefix = "sessionlog-ts-") {
  return mkdtempSync(join(tmpdir(), prefix));
}

/**
 * Start a server (extra `serve` flags in args; clientOptions for the readiness probe, e.g. TLS).
 * Always `await server.stop()`, then `server.remove()` when done with its data.
 */
export async function startServer({ port, root, args = [], clientOptions = {} } = {}) {
  const folder = root ?? tempDir();
  const listen = port ?? (await freePort());
  const address = `127.0.0.1:${listen}`;
  const log = openSync(join(folder, `server-${Date.now()}.log`), "a");
  const command = ["serve", "--data", join(folder, "data"), "--listen", address, ...args];
  const child = spawn(SESSIONLOG_BIN, command, {
    stdio: ["ignore", log, log],
    env: Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("SESSIONLOG_"))),
  });
  const exited = new Promise((done) => child.once("exit", (code, signal) => done(code ?? signal)));
  const probe = new SessionLogClient(address, { ...clientOptions, timeoutMs: 1000, retry: { giveUpAfterMs: 0 } });
  try {
    const deadline = Date.now() + 20_000;
    for (;;) {
      if (child.exitCode !== null) throw new Error(`server exited with ${child.exitCode}; see ${folder}`);
      try {
        await probe.getSession("ready-probe");
        break;
      } catch (error) {
        if (error?.reason === "WRONG_GROUP") break; // a sharded server that does not own the probe: it answers
        if (Date.now() > deadline) throw error;
        await new Promise((done) => setTimeout(done, 50));
      }
    }
  } finally {
    probe.close();
  }
  return {
    address,
    port: listen,
    root: folder,
    pid: child.pid,
    /** SIGTERM and wait for exit (SIGKILL after 10 s); resolves to the exit code or signal. */
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
      try {
        return await exited;
      } finally {
        clearTimeout(timer);
      }
    },
    /** Every process of this server: the one started and its workers (its children). */
    pids() {
      const children = readFileSync(`/proc/${child.pid}/task/${child.pid}/children`, "utf8");
      return [child.pid, ...children.split(/\s+/).filter(Boolean).map(Number)];
    },
    /** SIGKILL (a crash) and wait for the exit. */
    async kill() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
      return await exited;
    },
    remove() {
      rmSync(folder, { recursive: true, force: true });
    },
  };
}

/**
 * One server and one client for the tests of the describe block this is called in: started by
 * its before hook, closed, stopped and removed by its after hook. The tests read `live.server`
 * and `live.client` (set before the first test runs). `args` are extra `serve` flags,
 * `clientOptions` the client's.
 */
export function useServer({ args = [], clientOptions = {} } = {}) {
  const live = { server: undefined, client: undefined };
  before(async () => {
    live.server = await startServer({ args });
    live.client = new SessionLogClient(live.server.address, clientOptions);
  });
  after(async () => {
    live.client?.close();
    await live.server?.stop();
    live.server?.remove();
  });
  return live;
}

/**
 * A single-member etcd (Debian's etcd-server; `make etcd-tools`) on free 127.0.0.1 ports with a
 * temp data folder, ready once its JSON gateway answers. Always `await etcd.stop()`.
 */
export async function startEtcd() {
  const folder = tempDir("sessionlog-ts-etcd-");
  const client = `http://127.0.0.1:${await freePort()}`;
  const peer = `http://127.0.0.1:${await freePort()}`;
  const log = openSync(join(folder, "etcd.log"), "a");
  const args = [
    "--name", "ts", "--data-dir", join(folder, "data"),
    "--listen-client-urls", client, "--advertise-client-urls", client,
    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
    "--initial-cluster", `ts=${peer}`, "--initial-cluster-state", "new",
    "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
  ];
  const child = spawn("etcd", args, {
    stdio: ["ignore", log, log],
    env: Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("ETCD"))),
  });
  const exited = new Promise((done) => child.once("exit", (code, signal) => done(code ?? signal)));
  const address = client.slice("http://".length);
  const etcd = {
    address,
    /** PUT through the JSON gateway, as a leader's campaign would. */
    async put(key, value) {
      await gateway(address, "put", { key: b64(key), value: b64(value) });
    },
    async remove(key) {
      await gateway(address, "deleterange", { key: b64(key) });
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
      try {
        return await exited;
      } finally {
        clearTimeout(timer);
        rmSync(folder, { recursive: true, force: true });
      }
    },
  };
  const deadline = Date.now() + 20_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`etcd exited with ${child.exitCode}; see ${folder}/etcd.log`);
    try {
      await gateway(address, "range", { key: b64("/ready") });
      return etcd;
    } catch (error) {
      if (Date.now() > deadline) {
        await etcd.stop();
        throw error;
      }
      await new Promise((done) => setTimeout(done, 50));
    }
  }
}

const b64 = (text) => Buffer.from(text).toString("base64");

async function gateway(address, verb, body) {
  const reply = await fetch(`http://${address}/v3/kv/${verb}`, {
    method: "POST",
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(2_000),
  });
  if (!reply.ok) throw new Error(`etcd ${verb}: HTTP ${reply.status}`);
  return reply.json();
}
