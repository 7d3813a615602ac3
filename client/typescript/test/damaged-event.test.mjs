// A stored event damaged inside its bytes, on a real store: Since sends events as they are stored,
// unparsed, so the client is the first to find that one is not an Event. It must say so as the
// typed DataCorruptedError (DATA_CORRUPTED, naming admin verify), as the Python client does,
// without retrying, and the other sessions must read whole.
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { DataCorruptedError, SessionLogClient, SessionLogError } from "sessionlog-client";

import { startServer, tempDir } from "./server.mjs";

const EVENTS = 20;
const MARKER = Buffer.from("damage-me ");
const text = (marked) => (marked ? MARKER.toString() : "intact ") + "x".repeat(200);

/**
 * Make every stored copy of the marked event undecodable: its text (a Value's string_value) is
 * behind the tag 0x1a (field 3, length-delimited) and its length, 210 (d2 01). The tag becomes
 * 0x7f: field 15, wire type 7, which no protobuf parser reads (protobufjs reads a known field
 * whatever its wire type, and a string whatever its length says, so neither alone would do).
 */
function damage(file) {
  const content = readFileSync(file);
  let found = 0;
  for (let at = content.indexOf(MARKER); at !== -1; at = content.indexOf(MARKER, at + 1)) {
    assert.deepEqual([...content.subarray(at - 3, at)], [0x1a, 0xd2, 0x01], "the text's tag and length");
    content[at - 3] = 0x7f;
    found += 1;
  }
  assert.ok(found > 0, "the marked event is in the data file");
  writeFileSync(file, content);
}

describe("an event the client cannot decode", () => {
  const root = tempDir();
  let server;
  let client;

  before(async () => {
    const writer = await startServer({ root });
    const append = new SessionLogClient(writer.address);
    try {
      for (const id of ["whole", "damaged"]) {
        const events = Array.from({ length: EVENTS }, (_, i) => ({
          type: "user_message",
          data: { content: text(id === "damaged" && i === 7) },
        }));
        await append.append(id, events);
      }
    } finally {
      append.close();
    }
    assert.equal(await writer.stop(), 0);
    damage(join(root, "data", "data.mdb"));
    server = await startServer({ root });
    client = new SessionLogClient(server.address, { retry: { giveUpAfterMs: 30_000 } });
  });

  after(async () => {
    client?.close();
    await server?.stop();
    server?.remove();
  });

  test("since() rejects with DataCorruptedError naming admin verify, at once, not after retries", async () => {
    const read = [];
    const started = Date.now();
    const stream = client.since("damaged");
    await assert.rejects(
      (async () => {
        for await (const event of stream) read.push(event.seq);
      })(),
      (error) => {
        assert.ok(error instanceof DataCorruptedError, `${error?.name}: ${error?.message}`);
        assert.ok(error instanceof SessionLogError);
        assert.equal(error.reason, "DATA_CORRUPTED");
        assert.equal(error.codeName, "DATA_LOSS");
        assert.match(error.message, /admin verify/);
        assert.match(error.message, /'damaged'/);
        return true;
      },
    );
    assert.ok(Date.now() - started < 10_000, "no retry of a reply that cannot be decoded");
    assert.equal(stream.reconnects, 0);
    assert.ok(read.every((seq) => seq < 7), `only events before the damaged one: ${read}`);
  });

  test("follow() rejects the same way; the other session reads whole", async () => {
    await assert.rejects(
      (async () => {
        for await (const event of client.follow("damaged")) void event;
      })(),
      (error) => error instanceof DataCorruptedError,
    );
    const seqs = [];
    for await (const event of client.since("whole")) seqs.push(event.seq);
    assert.equal(seqs.length, EVENTS);
  });

  test("the server's own DATA_CORRUPTED (Surface over the damaged event) is the same class", async () => {
    await assert.rejects(client.surface("damaged"), (error) => error instanceof DataCorruptedError && error.reason === "DATA_CORRUPTED");
  });
});
