// Real `sessionlog serve` processes for the tests: a free port, a temp data folder, readiness by
// connecting, and stop by PID (SIGTERM, then SIGKILL if it hangs).
import { spawn } from "node:child_process";
import { mkdtempSync, openSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { SessionLogClient } from "@sessionlog/client";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
/** The server binary: $SESSIONLOG_BIN (the Python test passes its venv's), else .venv's. */
export const SESSIONLOG_BIN = process.env.SESSIONLOG_BIN ?? join(ROOT, ".venv", "bin", "sessionlog");

export function freePort() {
  return new Promise((done, fail) => {
    const probe = createServer();
    probe.once("error", fail);
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address();
      probe.close(() => done(port));
    });
  });
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
    remove() {
      rmSync(folder, { recursive: true, force: true });
    },
  };
}
