// Types of sessionlog-client/claude-agent-sdk. The SDK's own types are restated structurally
// (the client does not depend on @anthropic-ai/claude-agent-sdk): a SessionlogSessionStore is
// assignable to the SDK's `SessionStore`.
import { SessionLogClient } from "./index.js";

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

/** The data key holding the entry's JSON text. */
export const ENTRY_JSON_KEY: "entry_json";
export function escape(part: string): string;
export function unescape(part: string): string;
/** A hash of the entries' uuids; undefined when no entry has one. */
export function requestIdOf(entries: SessionStoreEntry[]): string | undefined;
export function eventOfEntry(entry: SessionStoreEntry): { type: string; data: Record<string, unknown> };
export function entryOf(event: { data?: Record<string, unknown> }): SessionStoreEntry | undefined;

export class SessionlogSessionStore {
  constructor(
    client: SessionLogClient | string,
    options?: { prefix?: string; foldSessionSummary?: FoldSessionSummary },
  );
  readonly client: SessionLogClient;
  readonly prefix: string;
  /** Closes the client the store opened from an address (not one it was given). */
  close(): void;
  /** The sessionlog session of a main transcript; RangeError when it would not fit 235 bytes. */
  mainId(key: { projectKey: string; sessionId: string }): string;
  /** The sessionlog session holding a transcript (a sub-agent child for a subpath). */
  sessionLogId(key: SessionKey): string;
  append(key: SessionKey, entries: SessionStoreEntry[]): Promise<void>;
  load(key: SessionKey): Promise<SessionStoreEntry[] | null>;
  listSessions(projectKey: string): Promise<Array<{ sessionId: string; mtime: number }>>;
  /** Present only when foldSessionSummary was given. */
  listSessionSummaries?(projectKey: string): Promise<SessionSummaryEntry[]>;
  delete(key: SessionKey): Promise<void>;
  listSubkeys(key: { projectKey: string; sessionId: string }): Promise<string[]>;
}
