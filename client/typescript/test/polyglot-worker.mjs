// A Node worker driven by tests/e2e/test_client_typescript.py over stdin/stdout:
//   node test/polyglot-worker.mjs HOST:PORT SESSION COUNT LABEL
// prints "ready" once connected, appends COUNT user messages "LABEL-i" one by one after it reads
// "go", prints "done", then after "read" prints the derived messages as one JSON line and exits.
import { createInterface } from "node:readline";

import { SessionLogClient } from "sessionlog-client";

const [target, session, count, label] = process.argv.slice(2);
const client = new SessionLogClient(target);
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

async function expect(word) {
  const { value, done } = await lines.next();
  if (done || value.trim() !== word) throw new Error(`expected ${word}, got ${done ? "EOF" : value}`);
}

try {
  await client.waitForReady(10_000);
  console.log("ready");
  await expect("go");
  for (let i = 0; i < Number(count); i += 1) {
    await client.append(session, [{ type: "user_message", data: { content: `${label}-${i}` } }]);
  }
  console.log("done");
  await expect("read");
  const { messages, seqs } = await client.deriveMessages(session);
  console.log(JSON.stringify({ messages, seqs }));
} finally {
  client.close();
}
process.exit(0);
