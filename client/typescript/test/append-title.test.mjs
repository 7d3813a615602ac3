// Append's title and expectedUid from the Node client against a real server: the title set in the
// commit of the events, the session's uid (sessionUid, Session.uid, EventPage.sessionUid), a stale
// uid refused with SESSION_UID_MISMATCH and nothing written.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { useServer } from "./server.mjs";

const user = (content) => ({ type: "user_message", data: { content } });

describe("append with a title and an expected uid", () => {
  const live = useServer();

  test("the title is set with the events; a bad one fails the append whole", async () => {
    const reply = await live.client.append("titled", [user("a")], { title: "first" });
    assert.ok(reply.sessionUid);
    const { session } = await live.client.getSession("titled");
    assert.equal(session.title, "first");
    assert.equal(session.uid, reply.sessionUid);
    await assert.rejects(
      live.client.append("titled", [user("b")], { title: "x".repeat(1025) }),
      (error) => error.reason === "INVALID_SESSION_FIELD",
    );
    const after = (await live.client.getSession("titled")).session;
    assert.equal(after.eventCount, 1);
    assert.equal(after.title, "first");
  });

  test("expectedUid refuses a session deleted and written again, and passes the current one", async () => {
    const old = (await live.client.append("remade", [user("a")])).sessionUid;
    await live.client.deleteSession("remade");
    const now = (await live.client.append("remade", [user("b")])).sessionUid;
    assert.notEqual(now, old);
    assert.equal((await live.client.listEvents("remade")).sessionUid, now);
    await assert.rejects(
      live.client.hide("remade", 0, 0, { expectedSeq: 1, expectedUid: old }),
      (error) => error.reason === "SESSION_UID_MISMATCH" && error.metadata.uid === now,
    );
    assert.equal((await live.client.getSession("remade")).session.eventCount, 1);
    const hid = await live.client.hide("remade", 0, 0, { expectedSeq: 1, expectedUid: now });
    assert.equal(hid.nextSeq, 2);
  });
});
