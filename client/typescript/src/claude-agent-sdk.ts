// A sessionlog SessionStore for the Claude Agent SDK (`@anthropic-ai/claude-agent-sdk`), which the
// client does not depend on: the store is the SDK's structural `SessionStore` type.
//
//   import { foldSessionSummary, query } from "@anthropic-ai/claude-agent-sdk";
//   import { SessionlogSessionStore } from "sessionlog-client/claude-agent-sdk";
//   const sessionStore = new SessionlogSessionStore("127.0.0.1:50051", { foldSessionSummary });
//   query({ prompt, options: { sessionStore } });
//
// The mapping is the Python store's (sessionlog_client/claude_agent_sdk.py), key for key, so either
// reads what the other wrote:
// - a main transcript is the session `{prefix}{project}.{session}`, a subagent transcript its
//   sub-agent child `{prefix}{project}.{session}.{subpath}` whose title is the subpath; each part
//   escaped (letters, numbers, marks and "-" kept, anything else "_" and two hex digits per UTF-8
//   byte), a project key or subpath escaped past 64 bytes named by "_h" and a hash of it;
// - each entry is one event, its JSON in data.entry_json; user and assistant text, tool calls
//   and tool results project to the derived view, anything else is STEP_END;
// - an append's request id is a hash of its entries' uuids, so a retried batch is stored once;
// - the SDK's summary fold is kept in the main session's title, {"n": events covered, "data"},
//   so both listings are one ListSessions walk; a summary covering fewer events than the log is
//   reported 1 ms older than the session (the SDK then re-folds it from its entries). The fold is
//   the SDK's own `foldSessionSummary`, passed in: without it the store has no
//   listSessionSummaries and the SDK loads each session instead. The title is set by the Append
//   of the entries (its title field): one call, one synced commit. The store remembers what it
//   last wrote per session, so an append right after its own folds in without reading the title
//   back; the append names the log it folded onto (expectedSeq, expectedUid), and one refused
//   (another writer appended, or the session was deleted and made again) reads the title
//   (GetSession) and folds again. A store's first append to a session folds onto nothing with
//   expectedSeq 0: one call for a new session, a refusal and a read for one holding events;
// - delete of a main transcript erases its children, then it (DeleteSession).

import { createHash } from "node:crypto";

import { SessionLogClient } from "./index.js";
import type { EventTypeName, JsonObject, NewEvent, Session } from "./index.js";

// The SDK's own types, restated structurally (the client does not depend on
// @anthropic-ai/claude-agent-sdk): a SessionlogSessionStore is assignable to its `SessionStore`.

/** One JSONL transcript line (the SDK's SessionStoreEntry). */
export type SessionStoreEntry = { type: string; uuid?: string; timestamp?: string; [k: string]: unknown };
/** A transcript's key (the SDK's SessionKey); subpath names a subagent transcript. */
export type SessionKey = { projectKey: string; sessionId: string; subpath?: string };
/** A persisted summary (the SDK's SessionSummaryEntry); data is opaque. */
export type SessionSummaryEntry = { sessionId: string; mtime: number; data: Record<string, unknown> };
/** The SDK's foldSessionSummary. */
export type FoldSessionSummary = (
  prev: SessionSummaryEntry | undefined,
  key: SessionKey,
  entries: SessionStoreEntry[],
  options?: { mtime?: number },
) => SessionSummaryEntry;

/** A content block or an entry read field by field. */
type Fields = { [key: string]: unknown };

/** The data key holding the entry's JSON text. */
export const ENTRY_JSON_KEY: "entry_json" = "entry_json";
const MAX_ID_BYTES = 235;
const MAX_TITLE_BYTES = 1024;
const MAX_PART_BYTES = 64;
const KEPT = /^[\p{L}\p{N}\p{M}-]$/u;

const bytes = (text: string): number => Buffer.byteLength(text, "utf8");

/** `part` in the characters a session id may hold, with no ".", as the Python store escapes. */
export function escape(part: string): string {
  let out = "";
  for (const ch of part) {
    if (KEPT.test(ch)) out += ch;
    else for (const b of Buffer.from(ch, "utf8")) out += `_${b.toString(16).padStart(2, "0")}`;
  }
  return out;
}

/** The string escape() made `part` from. */
export function unescape(part: string): string {
  const raw: number[] = [];
  for (let i = 0; i < part.length; ) {
    if (part[i] === "_") {
      raw.push(parseInt(part.slice(i + 1, i + 3), 16));
      i += 3;
    } else {
      const ch = String.fromCodePoint(part.codePointAt(i) as number);
      raw.push(...Buffer.from(ch, "utf8"));
      i += ch.length;
    }
  }
  return Buffer.from(raw).toString("utf8");
}

function idPart(value: string, limit: number): string {
  const escaped = escape(value);
  if (bytes(escaped) <= limit) return escaped;
  return `_h${createHash("sha256").update(value, "utf8").digest("hex").slice(0, 40)}`;
}

/** The append's request id: a hash of the entries' uuids; undefined when none has one. */
export function requestIdOf(entries: SessionStoreEntry[]): string | undefined {
  const uuids = entries.filter((e) => typeof e.uuid === "string").map((e) => e.uuid as string);
  if (uuids.length === 0) return undefined;
  return `claude.${createHash("sha256").update(uuids.join("\n"), "utf8").digest("hex").slice(0, 48)}`;
}

function textOf(value: unknown): string | null {
  if (typeof value === "string") return value;
  if (!Array.isArray(value)) return null;
  const texts: string[] = [];
  for (const part of value) {
    if (typeof part === "string") texts.push(part);
    else if (part && typeof part === "object" && part.type === "text" && typeof part.text === "string") {
      texts.push(part.text);
    }
  }
  return texts.length ? texts.join("\n") : null;
}

/** The event storing `entry`: its JSON verbatim, plus what the derived view shows. */
export function eventOfEntry(entry: SessionStoreEntry): { type: EventTypeName; data: JsonObject } {
  const data: JsonObject = { entry_type: entry.type ?? "", [ENTRY_JSON_KEY]: JSON.stringify(entry) };
  const message = entry.message;
  const content = message && typeof message === "object" ? (message as Fields).content : undefined;
  const blocks: Fields[] = Array.isArray(content) ? content.filter((b) => b && typeof b === "object") : [];
  if (entry.type === "user") {
    const results = blocks.filter((b) => b.type === "tool_result");
    if (results.length) {
      const first = results[0];
      if (typeof first.tool_use_id === "string") data.tool_call_id = first.tool_use_id;
      data.content = textOf(first.content) ?? JSON.stringify(first.content ?? null);
      return { type: "tool_result", data };
    }
    const text = textOf(content);
    if (text === null) return { type: "step_end", data };
    data.content = text;
    return { type: "user_message", data };
  }
  if (entry.type === "assistant") {
    const text = textOf(content);
    const calls = blocks
      .filter((b) => b.type === "tool_use")
      .map((b) => ({
        id: String(b.id ?? ""),
        type: "function",
        function: { name: String(b.name ?? ""), arguments: JSON.stringify(b.input ?? null) },
      }));
    if (text === null && calls.length === 0) return { type: "step_end", data };
    if (text !== null) data.content = text;
    if (calls.length) data.tool_calls = calls;
    return { type: "assistant_message", data };
  }
  return { type: "step_end", data };
}

/** The entry an event stores, or undefined for an event another writer appended. */
export function entryOf(event: { data?: Record<string, unknown> }): SessionStoreEntry | undefined {
  const text = event.data?.[ENTRY_JSON_KEY];
  if (typeof text !== "string") return undefined;
  const entry = JSON.parse(text);
  return entry && typeof entry === "object" && !Array.isArray(entry) ? entry : undefined;
}

function summaryTitle(covered: number, data: Record<string, unknown>): string {
  const text = JSON.stringify({ n: covered, data });
  return bytes(text) <= MAX_TITLE_BYTES ? text : JSON.stringify({ n: covered });
}

/** A summary as a title holds it: the events it covers, and the fold's data (none when the
 * title had no room for it). */
type Summary = { covered: number; data: Record<string, unknown> | undefined };
/** A main session as the store knows it: its uid, its event count, the summary data over its
 * entries (undefined: none yet). */
type Known = Summary & { uid: string };

/** What a store's first append to a session assumes: none there yet (or an empty one). Its
 * expectedSeq 0 makes that a checked guess: a log holding events refuses it (SEQ_CONFLICT) and
 * the store reads the title then, so a new session costs one call, not a GetSession too. */
const NEW: Known = { uid: "", covered: 0, data: undefined };

function readSummary(title: string): Summary | undefined {
  let held;
  try {
    held = JSON.parse(title);
  } catch {
    return undefined;
  }
  if (!held || typeof held !== "object" || !Number.isInteger(held.n)) return undefined;
  const data = held.data && typeof held.data === "object" && !Array.isArray(held.data) ? held.data : undefined;
  return { covered: held.n, data };
}

/** The session's update time in epoch ms (RFC 3339 with up to 9 fraction digits in). */
const ms = (session: Session): number => Date.parse((session.updateTime ?? "").replace(/(\.\d{3})\d+/, "$1"));

/** The Claude Agent SDK's SessionStore on a sessionlog server. */
export class SessionlogSessionStore {
  readonly client: SessionLogClient;
  readonly prefix: string;
  private readonly ownClient: boolean;
  private readonly children: Set<string>;
  /** What this store's last append left in each main session (uid, length, the summary data
   * its title holds): the next append folds its entries into it without reading the title back,
   * and names the uid and length, so a log changed meanwhile refuses it. */
  private readonly written: Map<string, Known>;
  private readonly fold: FoldSessionSummary | undefined;
  /** Present only when foldSessionSummary was given. */
  listSessionSummaries?: (projectKey: string) => Promise<SessionSummaryEntry[]>;

  /**
   * @param client a SessionLogClient (its owner closes it) or an address (close() closes the one
   *   the store opens)
   * @param options prefix starts every session id ("claude." by default); foldSessionSummary is the
   *   SDK's, for listSessionSummaries
   */
  constructor(
    client: SessionLogClient | string,
    { prefix = "claude.", foldSessionSummary }: { prefix?: string; foldSessionSummary?: FoldSessionSummary } = {},
  ) {
    this.client = typeof client === "string" ? new SessionLogClient(client) : client;
    this.ownClient = typeof client === "string";
    this.prefix = prefix;
    this.children = new Set();
    this.written = new Map();
    this.fold = foldSessionSummary;
    if (foldSessionSummary) {
      this.listSessionSummaries = async (projectKey: string) =>
        (await this.mains(projectKey)).flatMap(({ summary }) => (summary ? [summary] : []));
    }
  }

  /** Closes the client the store opened from an address (not one it was given). */
  close(): void {
    if (this.ownClient) this.client.close();
  }

  private projectPrefix(projectKey: string): string {
    return `${this.prefix}${idPart(projectKey, MAX_PART_BYTES)}.`;
  }

  /** The sessionlog session of the main transcript of `key`; throws when it would not fit. */
  mainId(key: { projectKey: string; sessionId: string }): string {
    const id = this.projectPrefix(key.projectKey) + escape(key.sessionId);
    if (bytes(id) > MAX_ID_BYTES - MAX_PART_BYTES - 1) {
      throw new RangeError(
        `the session id ${JSON.stringify(key.sessionId)} is too long for a sessionlog session id ` +
          `(at most ${MAX_ID_BYTES} bytes, with the prefix, project and subpath)`,
      );
    }
    return id;
  }

  /** The sessionlog session holding `key`'s transcript (a child for a subpath). */
  sessionLogId(key: SessionKey): string {
    return key.subpath ? `${this.mainId(key)}.${idPart(key.subpath, MAX_PART_BYTES)}` : this.mainId(key);
  }

  async append(key: SessionKey, entries: SessionStoreEntry[]): Promise<void> {
    if (entries.length === 0) return;
    const logId = this.sessionLogId(key);
    if (key.subpath) await this.ensureChild(key, logId);
    const requestId = requestIdOf(entries);
    const events = entries.map(eventOfEntry) as NewEvent[];
    try {
      if (!key.subpath && this.fold) await this.appendMain(key, logId, entries, events, requestId);
      else await this.client.append(logId, events, requestId ? { requestId } : {});
    } catch (error) {
      if (reasonOf(error) === "REQUEST_ID_REUSED") return; // those uuids are stored: a duplicate
      throw error;
    }
  }

  async load(key: SessionKey): Promise<SessionStoreEntry[] | null> {
    const loaded: SessionStoreEntry[] = [];
    for await (const batch of this.client.since(this.sessionLogId(key)).batches()) {
      for (const event of batch) {
        const entry = entryOf(event);
        if (entry !== undefined) loaded.push(entry);
      }
    }
    return loaded.length ? loaded : null;
  }

  async listSessions(projectKey: string): Promise<Array<{ sessionId: string; mtime: number }>> {
    return (await this.mains(projectKey)).map(({ sessionId, session }) => ({ sessionId, mtime: ms(session) }));
  }

  async delete(key: SessionKey): Promise<void> {
    const logId = this.sessionLogId(key);
    if (!key.subpath) {
      for (const child of await this.client.children(logId)) await this.erase(child.sessionId);
    }
    await this.erase(logId);
  }

  async listSubkeys(key: { projectKey: string; sessionId: string }): Promise<string[]> {
    return (await this.client.children(this.mainId(key))).map((child) => child.title);
  }

  private async erase(logId: string): Promise<void> {
    this.children.delete(logId);
    this.written.delete(logId);
    try {
      await this.client.deleteSession(logId, { reason: "claude-agent-sdk delete" });
    } catch (error) {
      if (reasonOf(error) !== "SESSION_NOT_FOUND") throw error;
    }
  }

  private async make(logId: string, fields: { title?: string; parentSessionId?: string } = {}): Promise<void> {
    try {
      await this.client.createSession(logId, [], { requestId: "", ...fields });
    } catch (error) {
      if (reasonOf(error) !== "SESSION_ALREADY_EXISTS") throw error;
    }
  }

  /** The child session of a subagent transcript, and an empty main one when it comes first. */
  private async ensureChild(key: SessionKey, logId: string): Promise<void> {
    if (this.children.has(logId)) return;
    const parentSessionId = this.mainId(key);
    try {
      await this.make(logId, { title: key.subpath, parentSessionId });
    } catch (error) {
      if (reasonOf(error) !== "SESSION_NOT_FOUND") throw error;
      await this.make(parentSessionId);
      await this.make(logId, { title: key.subpath, parentSessionId });
    }
    this.children.add(logId);
  }

  /**
   * One Append: the entries, and the summary folded over them as the session's title, in one
   * synced commit. It names the log the summary was folded onto (expectedSeq and expectedUid):
   * after another writer's append, or a delete and a new session of the same length, it is
   * refused, and the store reads the title again and folds anew. The first append to a
   * session this store has not written folds onto nothing (NEW).
   */
  private async appendMain(
    key: SessionKey,
    logId: string,
    entries: SessionStoreEntry[],
    events: NewEvent[],
    requestId: string | undefined,
  ): Promise<void> {
    const fold = this.fold as FoldSessionSummary;
    const mainKey = { projectKey: key.projectKey, sessionId: key.sessionId };
    let known = this.written.get(logId) ?? NEW;
    for (;;) {
      const prev = known.data ? { sessionId: key.sessionId, mtime: 0, data: known.data } : undefined;
      const folded = fold(prev, mainKey, entries);
      const title = summaryTitle(known.covered + entries.length, folded.data);
      let reply;
      try {
        reply = await this.client.append(logId, events, {
          ...(requestId ? { requestId } : {}),
          expectedSeq: known.covered,
          expectedUid: known.uid,
          title,
        });
      } catch (error) {
        const reason = reasonOf(error);
        if (reason !== "SEQ_CONFLICT" && reason !== "SESSION_UID_MISMATCH") throw error;
        this.written.delete(logId);
        known = await this.summaryNow(mainKey, logId);
        continue;
      }
      if (reply.events.length && reply.events[0].seq === known.covered) {
        this.written.set(logId, { uid: reply.sessionUid, covered: reply.nextSeq, data: folded.data });
      } else {
        this.written.delete(logId); // a replayed batch (stored before): the title is not known here
      }
      return;
    }
  }

  /** The session's uid, length, and the summary data over its entries, read from its title;
   * folded from its entries when the title does not cover them all. */
  private async summaryNow(mainKey: { projectKey: string; sessionId: string }, logId: string): Promise<Known> {
    const { session } = await this.client.getSession(logId);
    if (!session.exists) return { uid: "", covered: 0, data: undefined };
    const held = readSummary(session.title);
    if (held?.data && held.covered === session.eventCount) {
      return { uid: session.uid, covered: session.eventCount, data: held.data };
    }
    const whole: SessionStoreEntry[] = [];
    for await (const event of this.client.since(logId)) {
      if (event.seq >= session.eventCount) break;
      const entry = entryOf(event);
      if (entry !== undefined) whole.push(entry);
    }
    const data = whole.length ? (this.fold as FoldSessionSummary)(undefined, mainKey, whole).data : undefined;
    return { uid: session.uid, covered: session.eventCount, data };
  }

  /** The project's main sessions holding entries, with their summaries, from ListSessions. */
  private async mains(
    projectKey: string,
  ): Promise<{ sessionId: string; session: Session; summary: SessionSummaryEntry | undefined }[]> {
    const prefix = this.projectPrefix(projectKey);
    const found: { sessionId: string; session: Session; summary: SessionSummaryEntry | undefined }[] = [];
    for await (const page of this.client.listSessions({ prefix })) {
      for (const session of page.sessions) {
        if (session.parentSessionId || session.eventCount === 0) continue;
        const sessionId = unescape(session.sessionId.slice(prefix.length));
        const held = readSummary(session.title);
        const summary = held?.data
          ? {
              sessionId,
              mtime: held.covered === session.eventCount ? ms(session) : ms(session) - 1,
              data: held.data,
            }
          : undefined;
        found.push({ sessionId, session, summary });
      }
    }
    return found;
  }
}

/** The reason of a SessionLogError (undefined for anything else). */
function reasonOf(error: unknown): string | undefined {
  return (error as { reason?: string } | null)?.reason;
}
