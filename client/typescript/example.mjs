// A runnable worker: `node example.mjs [HOST:PORT]` against `make run` (default 127.0.0.1:50051).
// It logs a short conversation, compacts it with a summary, follows the log, and prints what
// the model would see next.
import { SessionLogClient, SessionLogError, eventFromMessage } from "sessionlog-client";

const target = process.argv[2] ?? process.env.SESSIONLOG_SERVER ?? "127.0.0.1:50051";
const session = process.argv[3] ?? `example-${Date.now()}`;
const client = new SessionLogClient(target);

try {
  const first = await client.append(session, [
    { type: "system_message", data: { content: "You answer in one sentence." } },
    { type: "user_message", data: { content: "What is LMDB?" } },
  ]);
  // A model reply, in the chat format a model API returns, logged as the event it projects from.
  const reply = { role: "assistant", content: "A memory-mapped, copy-on-write B+tree store." };
  await client.append(session, [eventFromMessage(reply)], { expectedSeq: first.nextSeq });
  // Compaction: a summary replaces the question and the answer; nothing is deleted.
  await client.append(session, [
    { type: "system_message", data: { content: "[summary] LMDB explained." }, replace: [1, 2] },
  ]);

  const stream = client.follow(session);
  for await (const event of stream) {
    console.log(`event ${event.seq} ${event.type}${event.replace ? ` replaces ${event.replace.join("..")}` : ""}`);
    if (event.seq === 3) break; // every stored event seen; a worker would keep following
  }

  const { messages, seqs } = await client.deriveMessages(session);
  messages.forEach((message, i) => console.log(`message from seq ${seqs[i]}: ${message.role}: ${message.content}`));

  try {
    await client.append(session, [{ type: "user_message", data: { content: "late" } }], { expectedSeq: 0 });
  } catch (error) {
    if (!(error instanceof SessionLogError)) throw error;
    console.log(`refused: ${error.reason}, next_seq ${error.metadata.next_seq}`);
  }
} finally {
  client.close();
}
