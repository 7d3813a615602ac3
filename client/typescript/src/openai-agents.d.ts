// Types of sessionlog-client/openai-agents (the implementation is src/openai-agents.js).
import type {
  AgentInputItem,
  Session,
  SessionHistoryTransactionArgs,
  SessionHistoryTransactionAwareSession,
} from "@openai/agents";

import type { ClientOptions, Event, NewEvent, SessionLogClient } from "./index.js";

/** The data key holding the item's JSON text ("item_json"). */
export const ITEM_JSON_KEY: "item_json";
/** The data key naming the item's type ("item_type"). */
export const ITEM_TYPE_KEY: "item_type";

/** One item in view: the seq of the event storing it, the item, and that event. */
export interface SessionEntry {
  seq: number;
  item: AgentInputItem;
  event: Event;
}

/** The item's type; a role message without one is a "message". */
export function itemType(item: object): string;
/** The text a content value shows (text parts joined by newlines); null when there is none. */
export function textOf(value: unknown): string | null;
/** The event that stores an item: verbatim in item_json, plus the fields the derived view projects. */
export function itemToEvent(item: AgentInputItem): NewEvent;
/** The item an event stores, or undefined. */
export function eventItem(event: Event): AgentInputItem | undefined;
/** The items an event shows (a surface event of another writer reads as the items its message is). */
export function eventItems(event: Event): AgentInputItem[];
/** A replace's (or hide's) position is its start seq, any other event's its seq. */
export function position(event: Event): number;
/** The events no later replace or hide covers, in position order. */
export function inView(events: Event[]): Event[];
/** The items in view (of the events at positions from `from` on). */
export function visibleEntries(events: Event[], from?: number): SessionEntry[];
/** The lowest position from which a tail of the log decides the view. */
export function knownFrom(tail: Event[]): number;

/** JSON with every object's keys sorted (how items are compared). */
export function canonicalJson(value: unknown): string;
/** The request id an operation id of applyHistoryTransaction travels as. */
export function transactionRequestId(operationId: string): string;
/** applyHistoryTransaction refused the change (a suffix that does not match, a reused id); nothing was written. */
export class HistoryTransactionError extends Error {}

/**
 * The OpenAI Agents SDK's Session, stored in a sessionlog session: popItem and clearSession hide,
 * nothing is deleted. `client`: a SessionLogClient (yours to close), or the address(es) of the
 * server (the session opens a client with `options`; close() closes it).
 */
export class SessionlogSession implements Session, SessionHistoryTransactionAwareSession {
  constructor(sessionId: string, client?: SessionLogClient | string | string[], options?: ClientOptions);
  readonly sessionId: string;
  readonly client: SessionLogClient;
  getSessionId(): Promise<string>;
  /** The conversation, oldest first; with limit, the latest `limit` items in order (read from the end). */
  getItems(limit?: number): Promise<AgentInputItem[]>;
  /** The items in view with their events, and the log's length when read. */
  entries(limit?: number): Promise<{ entries: SessionEntry[]; length: number | undefined }>;
  addItems(items: AgentInputItem[]): Promise<void>;
  popItem(): Promise<AgentInputItem | undefined>;
  clearSession(): Promise<void>;
  /**
   * One atomic append under the operation id as request id: append_items, or replace_suffix (the
   * newest items must be expectedSuffix; they are hidden and the replacement appended). A retry
   * succeeds without applying it again; another transaction under the same id fails.
   */
  applyHistoryTransaction(args: SessionHistoryTransactionArgs): Promise<void>;
  close(): void;
}
