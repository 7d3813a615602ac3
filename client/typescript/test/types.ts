// Type-checked by `npm run typecheck` and `make lint` (tsc, no emit; never run): the declarations
// the build generates (lib/index.d.ts) describe the API as a TypeScript worker uses it.
import {
  type AppendResult,
  AppendStream,
  type AppendStreamOptions,
  type ChatMessage,
  DEFAULT_CONNECT_TIMEOUT_MS,
  DEFAULT_MAX_IN_FLIGHT,
  type DerivedMessages,
  type Event,
  type FollowedChange,
  type EventPage,
  eventFromMessage,
  LeadershipLostError,
  type ModelUsage,
  NotPrimaryError,
  ReplicasUnavailableError,
  SessionLogClient,
  SessionLogError,
  type StateResult,
  type StreamAppendOptions,
  type UsageReport,
} from "sessionlog-client";

export const seen: string[] = [];

export async function worker(target: string): Promise<ChatMessage[]> {
  const connectTimeoutMs: number = 2 * DEFAULT_CONNECT_TIMEOUT_MS; // exported, so declared too
  const client = new SessionLogClient(target, { timeoutMs: 5_000, connectTimeoutMs, retry: { giveUpAfterMs: 10_000 } });
  try {
    const reply = await client.append(
      "typed",
      [
        { type: "system_message", data: { content: "Be brief." } },
        { type: "user_message", data: { content: "hi", tags: ["a", 1, null] }, time: new Date() },
        { type: "system_message", data: { content: "[summary]" }, replace: [0, 1] },
      ],
      { expectedSeq: 0, requestId: "r-1" },
    );
    const next: number = reply.nextSeq;
    const copied = await client.importSession("typed-copy", reply.events, { createTime: new Date(), firstSeq: 0 });
    const imported: number = copied.importedCount;
    seen.push(String(imported));
    const stream = client.follow("typed", { seq: next - 1 });
    for await (const event of stream) {
      const seen: Event = event;
      if (seen.seq >= next - 1) break;
    }
    const followed = client.followSessions({ prefix: "ty", filter: "labels.x:*", after: 0, follow: false });
    for await (const change of followed) {
      const typed: FollowedChange = change;
      seen.push(`${typed.sessionId}@${typed.position}: ${typed.events.length} ${typed.deleted}`);
    }
    const resumeAt: number | null = followed.position;
    seen.push(String(resumeAt));
    await client.append("typed", [eventFromMessage({ role: "assistant", content: "ok" })]);
    await client.append("typed", [{ type: "turn_start", stateDelta: { step: 1, done: null } }]);
    const { state, eventCount }: StateResult = await client.getState("typed", { atSeq: next });
    if (eventCount !== next + 1 || !("step" in state)) throw new Error("state after the delta");
    for await (const page of client.listSessions({ prefix: "ty", pageSize: 10 })) {
      for (const session of page.sessions) seen.push(`${session.sessionId}: ${session.eventCount}`);
    }
    for await (const page of client.listLeaseAudit({ prefix: "ty", pageSize: 10 })) {
      for (const entry of page.entries) seen.push(`${entry.sessionId} #${entry.index}: ${entry.kind}`);
    }
    const { lease } = await client.acquireLease("typed", "w-1", { ttlMs: 30_000 });
    await client.releaseLease("typed", "w-1", { force: lease.token > 0 });
    const redacted: { seqs: number[]; position: number } = await client.redactEvents("typed", [0], { reason: "r" });
    const erased = await client.deleteSession("typed-copy", { expectedSeq: redacted.seqs.length, force: true });
    seen.push(`${erased.session.sessionId}: ${erased.eventCount} at ${erased.position}`);
    const { messages, seqs } = await client.deriveMessages("typed", { atSeq: next - 1 });
    if (seqs.length !== messages.length) throw new Error("one seq per message");
    const newest: EventPage = await client.listEvents("typed", { pageSize: 5, orderBy: "seq desc" });
    const last: Event[] = await client.lastEvents("typed", newest.events.length);
    const tail: DerivedMessages = await client.lastMessages("typed", 2, { atSeq: next - 1 });
    if (last.length > newest.eventCount || tail.nextPageToken.length < 0) throw new Error("impossible");
    return messages;
  } catch (error) {
    if (error instanceof SessionLogError && error.reason === "SEQ_CONFLICT") {
      seen.push(`${error.codeName}: retry at ${error.metadata.next_seq}`);
    }
    throw error;
  } finally {
    client.close();
  }
}

/** A group: several addresses, or etcd and a group name (type-checked only). */
export async function groupWorker(addresses: string[], etcd?: string): Promise<string | null> {
  const client = etcd
    ? new SessionLogClient(undefined, { cluster: etcd, group: "main" })
    : new SessionLogClient(addresses, { retry: { giveUpAfterMs: 30_000 } });
  try {
    try {
      await client.append("typed", [{ type: "user_message", data: { content: "hi" } }], { requestId: "r-2" });
    } catch (error) {
      if (error instanceof ReplicasUnavailableError) {
        const pending: number = error.needed - error.counted; // committed at error.position
        if (pending > 0) seen.push(`retry r-2 later: position ${error.position}`);
      } else if (error instanceof NotPrimaryError) {
        seen.push(`no primary at epoch ${error.epoch}: ${error.primary || "none known"}`);
      } else if (error instanceof LeadershipLostError && error.committed) {
        seen.push("maybe stored: retry r-2");
      } else {
        throw error;
      }
    }
    const epoch: number = client.epoch;
    const known: string[] = client.members;
    if (!known.length || epoch < 0) throw new Error("no member");
    return client.current;
  } finally {
    client.close();
  }
}

export async function spending(client: SessionLogClient): Promise<number> {
  await client.append("typed", [{ type: "step_end", usage: { model: "m", inputTokens: 5 } }]);
  const report: UsageReport = await client.getUsage("typed", { includeDescendants: true });
  const own: ModelUsage[] = report.ownUsage;
  const { session } = await client.getSession("typed");
  for await (const page of client.listSessions()) seen.push(String(page.usageTotal.length));
  return report.usage.reduce((sum, u) => sum + u.inputTokens, 0) + own.length + session.usage.length;
}

/** Pipelined appends: each promise its own result or error; close() once every answer is in. */
export async function pipelined(client: SessionLogClient, texts: string[]): Promise<number[]> {
  const options: AppendStreamOptions = { maxInFlight: DEFAULT_MAX_IN_FLIGHT / 2 };
  const stream: AppendStream = client.appendStream(options);
  const sent: Promise<AppendResult>[] = texts.map((content, i) => {
    const each: StreamAppendOptions = { expectedSeq: i, requestId: `t-${i}`, lenient: false };
    return stream.append("typed", [{ type: "user_message", data: { content } }], each);
  });
  const unanswered: number = stream.inFlight;
  await stream.close();
  const failure: SessionLogError | Error | null = stream.error;
  if (failure || unanswered < 0) throw failure;
  return (await Promise.all(sent)).map((result) => result.nextSeq);
}
