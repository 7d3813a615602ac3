// A sessionlog session for the OpenAI Agents SDK (`@openai/agents`, an optional peer dependency):
//
//   import { Agent, run } from "@openai/agents";
//   import { SessionlogSession } from "sessionlog-client/openai-agents";
//   const session = new SessionlogSession("chat-42", "127.0.0.1:50051");
//   await run(new Agent({ name: "helper" }), "What is LMDB?", { session });
//
// The mapping is the Python backend's (sessionlog_client/openai_agents.py), key for key, so either
// reads back what the other wrote:
// - every item is one event; the item itself is kept verbatim as its JSON text in data.item_json,
//   and its type in data.item_type ("message" for a role message without a type), so getItems
//   returns what addItems was given, item types this module has never heard of included;
// - a role message is a system (system, developer), user or assistant message whose content is its
//   text (the text parts joined by newlines);
// - a function or custom tool call is an assistant message whose tool_calls holds the call;
// - its output (function_call_result in this SDK, function_call_output in Python's) is a tool
//   result naming the call, with the output's text;
// - anything else is a bookkeeping event (TOOL_CALL when its type names a call or a tool, STEP_END
//   otherwise): it keeps its place in the log and never reaches DeriveMessages.
// A surface event some other writer appended (a summary replacing a range, a seeded message) reads
// as the items its message amounts to, so getItems and DeriveMessages show one conversation.
//
// popItem and clearSession append EVENT_TYPE_HIDE events; nothing is deleted. The server's
// shadowing rule (a replace or hide covers every earlier event whose position is in its range) is
// applied here to every event, the bookkeeping ones too, so a popped reasoning item leaves getItems.
// applyHistoryTransaction (the SDK's atomic, idempotent history change) is one append under a
// request id derived from the operation id.

import { createHash } from "node:crypto";

import type {
  AgentInputItem,
  Session,
  SessionHistoryTransactionArgs,
  SessionHistoryTransactionAwareSession,
} from "@openai/agents";

import { SessionLogClient } from "./index.js";
import type { AppendResult, ClientOptions, Event, EventTypeName, Json, JsonObject, NewEvent } from "./index.js";

/** One item in view: the seq of the event storing it, the item, and that event. */
export interface SessionEntry {
  seq: number;
  item: AgentInputItem;
  event: Event;
}

/** An item (or a part of one) read field by field. */
type Fields = { [key: string]: unknown };

/** The data key holding the item's JSON text. */
export const ITEM_JSON_KEY: "item_json" = "item_json";
/** The data key naming the item's type. */
export const ITEM_TYPE_KEY: "item_type" = "item_type";

const ROLE_TYPES: Record<string, EventTypeName> = {
  user: "user_message",
  system: "system_message",
  developer: "system_message",
  assistant: "assistant_message",
};
const TOOL_CALLS = new Set(["function_call", "custom_tool_call"]);
const TOOL_OUTPUTS = new Set(["function_call_result", "function_call_output", "custom_tool_call_output"]);
const TEXT_PARTS: Record<string, string> = { input_text: "text", output_text: "text", text: "text", refusal: "refusal" };
/** Pages read from the end hold at most this many events (the server's page limit). */
const MAX_PAGE_SIZE = 1000;
/** The most events of a log's end a session remembers between calls (its _tail). */
const TAIL_KEPT = 2000;

/** The end of a log as a session last read or wrote it (see SessionlogSession._tail); uid is the
 * session's Session.uid, "" when the read did not report it (Since): not trusted for a hide. */
type Tail = { events: Event[]; length: number; complete: boolean; uid: string };

/** A remembered tail with an append's stored events after it; undefined when they do not follow
 * on (another writer appended in between, or the session was deleted and made again). */
function extended(known: Tail, reply: AppendResult): Tail | undefined {
  if (reply.events.length === 0 || reply.events[0].seq !== known.length) return undefined;
  if (known.uid && reply.sessionUid !== known.uid) return undefined;
  const events = [...[...reply.events].reverse(), ...known.events];
  if (events.length > TAIL_KEPT) return { events: events.slice(0, TAIL_KEPT), length: reply.nextSeq, complete: false, uid: known.uid };
  return { events, length: reply.nextSeq, complete: known.complete, uid: known.uid };
}

const own = (object: object, key: string): boolean => Object.prototype.hasOwnProperty.call(object, key);

/** The item's type; a role message without one is a "message". */
export function itemType(item: object): string {
  const type = (item as Fields).type;
  if (typeof type === "string") return type;
  return own(item, "role") ? "message" : "unknown";
}

/**
 * The text a content value shows: a string as is; a part (or list of parts) whose type is a text
 * part, its text; the texts joined by newlines; null when there is none.
 */
export function textOf(value: unknown): string | null {
  if (typeof value === "string") return value;
  const parts = Array.isArray(value) ? value : value !== null && typeof value === "object" ? [value] : [];
  const texts: string[] = [];
  for (const part of parts) {
    if (typeof part === "string") {
      texts.push(part);
      continue;
    }
    if (part === null || typeof part !== "object") continue;
    const fields = part as Fields;
    const field = TEXT_PARTS[fields.type as string];
    const text = field === undefined ? undefined : fields[field];
    if (typeof text === "string") texts.push(text);
  }
  return texts.length > 0 ? texts.join("\n") : null;
}

const callIdOf = (item: Fields): Json => (item.callId ?? item.call_id ?? null) as Json;

/** The chat-format tool call of a function (or custom tool) call item. */
function toolCall(kind: string, item: Fields): JsonObject {
  const id = callIdOf(item);
  const name = item.name ?? null;
  if (kind === "function_call") {
    return { id, type: "function", function: { name, arguments: item.arguments ?? null } } as JsonObject;
  }
  return { id, type: "custom", custom: { name, input: item.input ?? null } } as JsonObject;
}

/** The event that stores `item`: verbatim, plus the fields the derived view projects. */
export function itemToEvent(agentItem: AgentInputItem): NewEvent {
  const item = agentItem as Fields;
  const kind = itemType(item);
  const data: JsonObject = { [ITEM_TYPE_KEY]: kind, [ITEM_JSON_KEY]: JSON.stringify(item) };
  let type: EventTypeName;
  if (kind === "message" && typeof item.role === "string" && own(ROLE_TYPES, item.role)) {
    type = ROLE_TYPES[item.role];
    const text = textOf(item.content);
    if (text !== null) data.content = text;
  } else if (TOOL_CALLS.has(kind)) {
    type = "assistant_message";
    data.tool_calls = [toolCall(kind, item)];
  } else if (TOOL_OUTPUTS.has(kind)) {
    type = "tool_result";
    const callId = callIdOf(item);
    if (typeof callId === "string") data.tool_call_id = callId;
    const text = textOf(item.output);
    if (text !== null) data.content = text;
  } else if (kind.includes("call") || kind.includes("tool") || kind.startsWith("mcp_")) {
    type = "tool_call";
  } else {
    type = "step_end";
  }
  return { type, data };
}

/** The item an event of a framework backend stores, or undefined. */
export function eventItem(event: Event): AgentInputItem | undefined {
  const text = event.data?.[ITEM_JSON_KEY];
  if (typeof text !== "string") return undefined;
  const item = JSON.parse(text);
  return item !== null && typeof item === "object" && !Array.isArray(item) ? item : undefined;
}

const ROLE_OF_TYPE: Record<string, string> = { user_message: "user", system_message: "system", assistant_message: "assistant" };

/**
 * The items an event shows: the one it stores, or, for a surface event another writer appended,
 * the items (in this SDK's shapes) its message reads as; none for other events.
 */
export function eventItems(event: Event): AgentInputItem[] {
  const stored = eventItem(event);
  if (stored !== undefined) return [stored];
  const data = event.data ?? {};
  const text = typeof data.content === "string" ? data.content : "";
  if (event.type === "tool_result") {
    if (typeof data.tool_call_id !== "string") return [];
    const name = typeof data.name === "string" ? data.name : "";
    return [{ type: "function_call_result", callId: data.tool_call_id, name, status: "completed", output: text } as AgentInputItem];
  }
  const role = ROLE_OF_TYPE[event.type];
  if (role === undefined) return [];
  const calls = Array.isArray(data.tool_calls) ? data.tool_calls : [];
  const shown: Fields[] = [];
  if (role !== "assistant") {
    shown.push({ role, content: text });
  } else if (text || calls.length === 0) {
    shown.push({ type: "message", role, status: "completed", content: [{ type: "output_text", text }] });
  }
  for (const call of calls as (JsonObject | null)[]) {
    const fn = call?.function;
    if (fn === null || typeof fn !== "object" || Array.isArray(fn)) continue;
    shown.push({ type: "function_call", callId: call?.id, name: fn.name, arguments: fn.arguments });
  }
  return shown as AgentInputItem[];
}

/** A replace's (or hide's) position is its start seq, any other event's its seq (SPEC §4). */
export function position(event: Pick<Event, "seq" | "replace">): number {
  return event.replace ? event.replace[0] : event.seq;
}

/** The events no later replace or hide covers, in position order (ties in seq order). */
export function inView(events: Event[]): Event[] {
  const ranges = events.filter((e) => e.replace).map((e) => [e.seq, ...(e.replace as [number, number])]);
  const shown = events.filter(
    (e) => !ranges.some(([seq, start, stop]) => seq > e.seq && start <= position(e) && position(e) <= stop),
  );
  return shown.sort((a, b) => position(a) - position(b) || a.seq - b.seq);
}

/**
 * The items in view, each with its event: { seq, item, event }.
 * `from`: only events at positions from it on (the rest of the log was not read).
 */
export function visibleEntries(events: Event[], from = 0): SessionEntry[] {
  const entries: SessionEntry[] = [];
  for (const event of inView(events)) {
    if (position(event) < from) continue;
    for (const item of eventItems(event)) entries.push({ seq: event.seq, item, event });
  }
  return entries;
}

/**
 * The lowest position from which a tail of the log (every event from its lowest seq on) decides
 * the view: an unread event is older than every read one, so only a read replace or hide can cover
 * it, and the ranges reaching down from the tail's first seq hide every unread event above them.
 */
export function knownFrom(tail: Pick<Event, "seq" | "replace">[]): number {
  if (tail.length === 0) return 0;
  let from = Math.min(...tail.map((e) => e.seq));
  for (let lowered = true; lowered; ) {
    lowered = false;
    for (const e of tail) {
      if (e.replace && e.replace[0] < from && e.replace[1] >= from - 1) {
        from = e.replace[0];
        lowered = true;
      }
    }
  }
  return from;
}

/** JSON with every object's keys sorted: two items compare equal when their JSON does. */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(value, (_, v) =>
    v !== null && typeof v === "object" && !Array.isArray(v)
      ? Object.fromEntries(
          Object.keys(v)
            .sort()
            .map((k) => [k, (v as Fields)[k]]),
        )
      : v,
  );
}

/** The request id an operation id travels as (fixed length, whatever the SDK's id holds). */
export function transactionRequestId(operationId: string): string {
  return `openai-agents-tx-${createHash("sha256").update(operationId).digest("hex")}`;
}

/** What applyHistoryTransaction throws for a change it refuses (nothing is written). */
export class HistoryTransactionError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "HistoryTransactionError";
  }
}

/**
 * The `Session` of the OpenAI Agents SDK, stored in a sessionlog session.
 *
 * `client` is a SessionLogClient (the caller's to close), or the address(es) of the server: then
 * the session opens its own client, which close() closes.
 */
export class SessionlogSession implements Session, SessionHistoryTransactionAwareSession {
  readonly sessionId: string;
  readonly client: SessionLogClient;
  private readonly _owned: boolean;
  /**
   * The end of the log as this session last read or wrote it (every event from the lowest seq
   * held to length - 1, newest first; complete: from seq 0). Only a guess: popItem's hide names
   * expectedSeq = length and expectedUid = uid, so a log another writer changed (or deleted and
   * made again to the same length) refuses it and the session reads again.
   */
  private _tail: Tail | undefined;

  constructor(sessionId: string, client?: SessionLogClient | string | string[], options: ClientOptions = {}) {
    if (typeof sessionId !== "string" || sessionId === "") throw new TypeError("sessionId must be a non-empty string");
    this.sessionId = sessionId;
    this._owned = !(client instanceof SessionLogClient);
    this.client = client instanceof SessionLogClient ? client : new SessionLogClient(client, options);
  }

  async getSessionId(): Promise<string> {
    return this.sessionId;
  }

  /**
   * The items in view with the events storing them, and the log's length when read. With a
   * limit, read from the end (ListEvents "seq desc") until the latest `limit` are known.
   */
  async entries(limit?: number | null): Promise<{ entries: SessionEntry[]; length: number | undefined }> {
    if (limit === undefined || limit === null) {
      const events: Event[] = [];
      for await (const batch of this.client.since(this.sessionId).batches()) events.push(...batch);
      const kept = events.slice(-TAIL_KEPT).reverse();
      this._tail = { events: kept, length: events.length, complete: kept.length === events.length, uid: "" };
      return { entries: visibleEntries(events), length: events.length };
    }
    if (limit <= 0) return { entries: [], length: undefined };
    const tail: Event[] = [];
    let pageToken = "";
    let length: number | undefined;
    let uid = "";
    const pageSize = Math.min(Math.max(limit + 1, 32), MAX_PAGE_SIZE);
    for (;;) {
      const page = await this.client.listEvents(this.sessionId, { pageSize, pageToken, orderBy: "seq desc" });
      if (length === undefined) uid = page.sessionUid;
      length ??= page.eventCount;
      tail.push(...page.events);
      pageToken = page.nextPageToken;
      const from = pageToken ? knownFrom(tail) : 0;
      const entries = visibleEntries(tail, from);
      if (from === 0 || entries.length >= limit) {
        const complete = !pageToken && tail.length <= TAIL_KEPT;
        this._tail = { events: tail.slice(0, TAIL_KEPT), length: length ?? 0, complete, uid };
        return { entries: entries.slice(-limit), length };
      }
    }
  }

  /** The conversation, oldest first; with limit, the latest `limit` items in order. */
  async getItems(limit?: number): Promise<AgentInputItem[]> {
    return (await this.entries(limit)).entries.map((e) => e.item);
  }

  /** One event per item, in one atomic append. */
  async addItems(items: AgentInputItem[]): Promise<void> {
    if (items.length === 0) return;
    const known = this._tail;
    const reply = await this.client.append(this.sessionId, items.map(itemToEvent));
    this._tail = known && extended(known, reply);
  }

  /**
   * Hide the newest item in view and return it; undefined when none is left. The hide names the
   * log's length as read, so a concurrent write makes it read again rather than hide another item.
   * A message another writer appended that reads as several items is hidden whole.
   */
  async popItem(): Promise<AgentInputItem | undefined> {
    for (;;) {
      let known = this._tail;
      let found: { entries: SessionEntry[]; length: number | undefined } | undefined;
      if (known?.uid) {
        const from = known.complete ? 0 : knownFrom(known.events);
        const shown = visibleEntries(known.events, from);
        if (shown.length > 0) found = { entries: shown, length: known.length }; // an empty view is only believed when read now
      }
      if (!found) {
        found = await this.entries(1);
        known = this._tail;
      }
      const newest = found.entries.at(-1);
      if (newest === undefined) return undefined;
      const where = position(newest.event);
      let reply: AppendResult;
      try {
        const expectedUid = known?.uid ?? "";
        reply = await this.client.hide(this.sessionId, where, where, { reason: "pop_item", expectedSeq: found.length, expectedUid });
      } catch (error) {
        const reason = (error as { reason?: string } | null)?.reason;
        if (reason === "SEQ_CONFLICT" || reason === "SESSION_UID_MISMATCH") {
          this._tail = undefined;
          continue;
        }
        throw error;
      }
      this._tail = known && extended(known, reply);
      return newest.item;
    }
  }

  /**
   * The SDK's atomic, idempotent history change (SessionHistoryTransactionAwareSession): one
   * append carrying the operation id as its request id, so the server stores both in one commit
   * and a retry of the same append is answered from the first. append_items appends the items;
   * replace_suffix checks that the newest items in view are expectedSuffix, then hides them and
   * appends the replacement in the same append (with expectedSeq: a concurrent write makes it
   * check again). The hide records the operation id and the transaction, so a retry after it
   * was applied (whose hide range would differ) is recognised and succeeds; the same id with
   * another transaction fails (HistoryTransactionError, or the server's REQUEST_ID_REUSED).
   */
  async applyHistoryTransaction({ operationId, transaction }: SessionHistoryTransactionArgs): Promise<void> {
    if (typeof operationId !== "string" || operationId === "") {
      throw new HistoryTransactionError("operationId must be a non-empty string");
    }
    const requestId = transactionRequestId(operationId);
    const recorded = canonicalJson(transaction);
    if (transaction?.type === "append_items") {
      await this._applyOnce(operationId, recorded, () => ({ events: transaction.items.map(itemToEvent) }), requestId);
      return;
    }
    if (transaction?.type !== "replace_suffix") {
      const type = (transaction as Fields | null)?.type;
      throw new HistoryTransactionError(`unknown session history transaction type ${JSON.stringify(type)}`);
    }
    for (;;) {
      const { entries, length } = await this.entries();
      const expected = transaction.expectedSuffix;
      const start = entries.length - expected.length;
      const suffix = entries.slice(Math.max(start, 0));
      if (start < 0 || suffix.some((e, i) => canonicalJson(e.item) !== canonicalJson(expected[i]))) {
        if (await this._applied(operationId, recorded)) return;
        throw new HistoryTransactionError("the session's newest items are not the expected suffix; nothing was changed");
      }
      if (start > 0 && suffix.length > 0 && entries[start - 1].event === suffix[0].event) {
        throw new HistoryTransactionError("the expected suffix starts inside one event's items; nothing was changed");
      }
      const events: NewEvent[] = [];
      if (suffix.length > 0) {
        const data = { reason: "replace_suffix", operation_id: operationId, transaction_json: recorded };
        events.push({ type: "hide", data, replace: [position(suffix[0].event), (length as number) - 1] });
      }
      events.push(...transaction.replacement.map(itemToEvent));
      try {
        await this._applyOnce(operationId, recorded, () => ({ events, expectedSeq: length }), requestId);
        return;
      } catch (error) {
        if ((error as { reason?: string } | null)?.reason === "SEQ_CONFLICT") continue;
        throw error;
      }
    }
  }

  /** Append `make()`'s events under the request id; REQUEST_ID_REUSED is fine when the log shows
   * this very transaction applied. */
  private async _applyOnce(
    operationId: string,
    recorded: string,
    make: () => { events: NewEvent[]; expectedSeq?: number },
    requestId: string,
  ): Promise<void> {
    const { events, expectedSeq } = make();
    if (events.length === 0) return;
    try {
      this._tail = undefined;
      await this.client.append(this.sessionId, events, { requestId, expectedSeq });
    } catch (error) {
      if ((error as { reason?: string } | null)?.reason === "REQUEST_ID_REUSED" && (await this._applied(operationId, recorded))) return;
      throw error;
    }
  }

  /** Whether a replace_suffix hide in the log records this operation with this transaction. */
  private async _applied(operationId: string, recorded: string): Promise<boolean> {
    for await (const event of this.client.since(this.sessionId)) {
      if (event.type === "hide" && event.data.operation_id === operationId) return event.data.transaction_json === recorded;
    }
    return false;
  }

  /** Hide every item so far; the log keeps them. */
  async clearSession(): Promise<void> {
    this._tail = undefined;
    await this.client.clear(this.sessionId, { reason: "clear_session" });
  }

  /** Close the client this session opened (not one passed in). */
  close(): void {
    if (this._owned) this.client.close();
  }
}
