// A Node follower driven by tests/e2e/test_dead_link.py over stdout:
//   node test/follow-worker.mjs HOST:PORT SESSION COUNT HEARTBEAT_MS CHANNEL_OPTIONS_JSON
// prints "ready" once connected, "event SEQ" for each event follow() delivers, "dead N" whenever
// the stream has deemed N streams dead so far, and "done" after COUNT events, then exits.
import { SessionLogClient } from "sessionlog-client";

const [target, session, count, heartbeatMs, channelOptions] = process.argv.slice(2);
const client = new SessionLogClient(target, {
  retry: { giveUpAfterMs: 20_000, initialBackoffMs: 50, maxBackoffMs: 500 },
  channelOptions: JSON.parse(channelOptions),
});
const stream = client.follow(session, { heartbeatMs: Number(heartbeatMs) });
let dead = 0;
const watch = setInterval(() => {
  if (stream.deadStreams !== dead) {
    dead = stream.deadStreams;
    console.log(`dead ${dead}`);
  }
}, 20);
const giveUp = setTimeout(() => stream.close(), 30_000);
try {
  await client.waitForReady(10_000);
  console.log("ready");
  let seen = 0;
  for await (const event of stream) {
    console.log(`event ${event.seq}`);
    seen += 1;
    if (seen >= Number(count)) break;
  }
  console.log("done");
} finally {
  clearInterval(watch);
  clearTimeout(giveUp);
  client.close();
}
process.exit(0);
