// Types of sessionlog-client (the implementation is plain ES modules in index.js).

/** A JSON value as stored in an event's data. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type JsonObject = { [key: string]: Json };

/** Event types by their short names; the upper-case and EVENT_TYPE_ forms are accepted too. */
export type EventTypeName =
  | "system_message"
  | "user_message"
  | "assistant_message"
  | "tool_result"
  | "tool_call"
  | "turn_start"
  | "turn_end"
  | "step_start"
  | "step_end"
  | "request_header"
  | "hide";

/** RFC 3339 with up to nanoseconds, e.g. "2026-01-02T03:04:05.123456Z". */
export type Time = string;

/** An event to append. `replace: [start, stop]` hides positions start..stop (inclusive). */
export interface NewEvent {
  type: EventTypeName | string;
  data?: JsonObject;
  replace?: [number, number];
  /** Stored exactly; the server's now when absent. */
  time?: Time | Date;
  /** Changes the session's state (getState): each key replaces the one before; null deletes it. */
  stateDelta?: JsonObject;
  /** The tokens a model call spent (the usage ledger sums them per model). */
  usage?: UsageInput;
}

/**
 * One model call's token usage. Cached input tokens are part of inputTokens, reasoning tokens
 * part of outputTokens; every count at most 2^32 - 1. model is required (INVALID_USAGE).
 */
export interface UsageInput {
  model: string;
  inputTokens?: number;
  outputTokens?: number;
  cachedInputTokens?: number;
  reasoningTokens?: number;
}

/** A usage as stored on an event: every count present. */
export interface Usage {
  model: string;
  inputTokens: number;
  outputTokens: number;
  cachedInputTokens: number;
  reasoningTokens: number;
}

/** Totals of one model: the sums of the events that named it, and how many did. */
export interface ModelUsage extends Usage {
  eventCount: number;
}

/** What getUsage returns. */
export interface UsageReport {
  /** Per model, in model order: the whole history (a fork's copies included), descendants added. */
  usage: ModelUsage[];
  /** The session's events covered (atSeq + 1, or its event count). */
  eventCount: number;
  /** Only the session's own events (from parentEventCount on). */
  ownUsage: ModelUsage[];
  /** With includeDescendants: the forks whose own usage was added. */
  descendantSessionIds: string[];
}

/** An event as stored. */
export interface Event {
  seq: number;
  type: EventTypeName;
  time: Time;
  data: JsonObject;
  replace?: [number, number];
  /** Set on an event erased by redactEvents: its data is empty. */
  redacted?: { time: Time; reason: string };
  usage?: Usage;
  /** Present only on events that carried a state delta. */
  stateDelta?: JsonObject;
}

/** getState's reply: the folded state and how many events it covers. */
export interface StateResult {
  state: JsonObject;
  eventCount: number;
}

export type Role = "system" | "user" | "assistant" | "tool";

/** A derived message in the OpenAI chat format. */
export interface ChatMessage {
  role: Role | "unspecified";
  /** null when the event had no content; a list when it carried metadata.content_parts. */
  content: string | Json[] | null;
  tool_calls?: JsonObject[];
  tool_call_id?: string;
  name?: string;
  /** Only with { extra: true }. */
  reasoning_content?: string;
  metadata?: JsonObject;
  created_at?: Time;
}

/** A chat message to seed a session with, or to log with eventFromMessage. */
export interface ChatMessageInput {
  role: Role | "developer" | string;
  content?: string | Json[] | null;
  tool_calls?: JsonObject[];
  tool_call_id?: string | null;
  name?: string | null;
  reasoning_content?: string | null;
  metadata?: JsonObject;
  created_at?: Time | Date;
}

export interface Lease {
  holder: string;
  /** Fencing token: grows with every acquisition. */
  token: number;
  acquireTime?: Time;
  expireTime?: Time;
}

export interface Session {
  sessionId: string;
  exists: boolean;
  eventCount: number;
  replaceGeneration: number;
  createTime?: Time;
  lastAppendTime?: Time;
  parentSessionId: string;
  parentEventCount: number;
  lease?: Lease;
  /** Usage totals per model (set by getSession and listSessions; empty from writes). */
  usage: ModelUsage[];
  title: string;
  labels: Record<string, string>;
  owner: string;
  status: string;
  /** The later of the last append and the last updateSession. */
  updateTime?: Time;
  /** A sub-agent child's spawning seq in its parent; undefined otherwise. */
  parentSeq?: number;
  /** When the server's retention sweeper deletes the session; undefined: never. */
  expireTime?: Time;
  /** Kept whatever its expireTime and the server's retention policy say. */
  pinned: boolean;
}

/** What createSession may set besides the events: a record and a sub-agent parent link. */
export interface SessionFields {
  title?: string;
  labels?: Record<string, string>;
  owner?: string;
  status?: string;
  /** Make the new session a child of this one (it starts empty). */
  parentSessionId?: string;
  /** With parentSessionId: the seq of the tool call that spawned the child. */
  parentSeq?: number;
  /** Expire this many milliseconds after the create (not with expireTime). */
  ttlMs?: number;
  /** Expire at this time (not with ttlMs). */
  expireTime?: Time | Date;
  /** Exempt from expiry and the server's retention policy. */
  pinned?: boolean;
}

export interface LeaseAuditEntry {
  kind: string;
  actor: string;
  previousHolder: string;
  previousToken: number;
  time?: Time;
}

/** One entry of listLeaseAudit: a lease audit entry with its session and its index there. */
export interface SessionLeaseAuditEntry extends LeaseAuditEntry {
  sessionId: string;
  index: number;
}

export interface LeaseAuditPage {
  entries: SessionLeaseAuditEntry[];
  nextPageToken: string;
}

export interface AppendResult {
  events: Event[];
  nextSeq: number;
  drops: { index: number; reason: string; message: string }[];
}

export interface SurfaceResult {
  events: Event[];
  eventCount: number;
  replaceGeneration: number;
}

export interface DerivedMessages {
  messages: ChatMessage[];
  /** seqs[i] is the seq of the event messages[i] came from. */
  seqs: number[];
  eventCount: number;
  replaceGeneration: number;
  /** When paging (pageSize or pageToken): the token for the messages before these; else "". */
  nextPageToken: string;
}

export interface EventPage {
  /** In the order asked for: seq ascending, or descending for "seq desc". */
  events: Event[];
  /** For the next page; "" when there is none. */
  nextPageToken: string;
  /** The session's event count when the page was read. */
  eventCount: number;
}

export interface SessionPage {
  sessions: Session[];
  nextPageToken: string;
  /** The page's sessions' usage summed per model. */
  usageTotal: ModelUsage[];
}

export interface RetryOptions {
  /** How long UNAVAILABLE is retried (appends, reads, stream reconnects). Default 30000. */
  giveUpAfterMs?: number;
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  /**
   * How many times a retried write (an append with a requestId, a lease acquire or renew) that
   * failed REPLICAS_UNAVAILABLE is sent again, to the same primary (each try waits up to its
   * --sync-timeout); then ReplicasUnavailableError. Default DEFAULT_REPLICAS_RETRIES (2).
   */
  replicasRetries?: number;
  /**
   * How long a WRONG_GROUP refusal is retried, within giveUpAfterMs (0: raised at once). A slot
   * move's refusals wrote nothing, so every call retries them: SLOT_MOVING within
   * giveUpAfterMs, WRONG_GROUP (HAProxy still sending a moved slot's calls to its old group
   * until haproxy-sync applies the new map) this long. A shardMap client reroutes WRONG_GROUP
   * at once instead. Default DEFAULT_WRONG_GROUP_FOR_MS (5000).
   */
  wrongGroupForMs?: number;
}

/** How long WRONG_GROUP is retried by default (RetryOptions.wrongGroupForMs). */
export declare const DEFAULT_WRONG_GROUP_FOR_MS: number;

export interface ClientOptions {
  /** Deadline of each unary call; default 10000. */
  timeoutMs?: number;
  /** Sent as "authorization: Bearer TOKEN" on every call (use with TLS). */
  token?: string;
  /** TLS with the system roots (implied by any of the PEM buffers below). */
  tls?: boolean;
  rootCerts?: Uint8Array;
  privateKey?: Uint8Array;
  certChain?: Uint8Array;
  /** Largest message sent or accepted; default 64 MiB (keep it >= the server's limit). */
  maxMessageBytes?: number;
  retry?: RetryOptions;
  /** The proto/ folder; default $SESSIONLOG_PROTO_DIR, else the package's (packed), else the repo's. */
  protoDir?: string;
  channelOptions?: Record<string, string | number>;
  /**
   * The first call waits at most this long for a connection; default 3000. Until the server
   * has answered once, a failed connection (refused, unknown host) rejects at once with
   * UNAVAILABLE naming the address instead of being retried.
   */
  connectTimeoutMs?: number;
  /** gRPC's wait-for-ready instead: calls wait for a connection up to their deadline. */
  waitForReady?: boolean;
  /**
   * etcd endpoints, "etcd://HOST:PORT[,HOST:PORT...]", whose JSON gateway names the leader of
   * `group` (key /sessionlog/groups/GROUP/leader); read at the first call and whenever the
   * primary is lost. Give it with `group`; the target may then be omitted.
   */
  cluster?: string;
  /** The group's name in etcd (with `cluster`). */
  group?: string;
  /**
   * Route by the shard map: "server" (GetShardMap from target) or "etcd://HOST:PORT[,...]"
   * (etcd's /sessionlog/shards). Each call naming a session goes to its owner group's primary;
   * WRONG_GROUP reloads the map and sends the call once more.
   */
  shardMap?: string;
}

/** One group of a shard map; ranges are inclusive [first, last] slot pairs. */
export interface ShardGroup {
  name: string;
  members: string[];
  ranges: Array<[number, number]>;
  /** The current primary ("" when not known). */
  primary: string;
}

/** A shard map as the client routes by it. */
export class ShardTable {
  constructor(epoch: number, groups: ShardGroup[]);
  readonly epoch: number;
  readonly groups: ShardGroup[];
  owner(sessionId: string): ShardGroup;
  withOwner(sessionId: string, group: ShardGroup, epoch: number): ShardTable;
  static fromReply(reply: unknown): ShardTable | null;
  static fromJson(text: string): ShardTable;
}

export const SLOTS: number;
export const SHARDS_KEY: string;
/** CRC-32 (IEEE) of bytes. */
export function crc32(bytes: Uint8Array): number;
/** crc32 of the id's UTF-8 bytes, modulo SLOTS. */
export function slotOf(sessionId: string): number;
/** After a WRONG_GROUP (its ErrorInfo metadata): the map to keep and the owner to go to. */
export function afterWrongGroup(
  before: ShardTable | null,
  newer: ShardTable | null,
  sessionId: string,
  metadata: Record<string, string>,
): { table: ShardTable | null; owner: ShardGroup | null };

interface CallOptions {
  timeoutMs?: number;
}

interface LeaseCallOptions extends CallOptions {
  leaseHolder?: string;
  leaseToken?: number;
}

/** createSession, seedSession and forkSession: retried on UNAVAILABLE with one requestId. */
export interface LifecycleOptions extends LeaseCallOptions {
  /** Idempotency key; a fresh UUID when absent, "" for none (and no retry). */
  requestId?: string;
}

export interface ImportOptions extends CallOptions {
  /** The seq of the chunk's first event: 0 creates the session, then its next seq. */
  firstSeq?: number;
  /** Read by the chunk that creates the session; the first event's time when absent. */
  createTime?: Time | Date;
  /** The session's last-append time after the chunk; its last event's when absent. */
  lastAppendTime?: Time | Date;
  /** The session it was forked from, read by the chunk that creates it. */
  parentSessionId?: string;
  parentEventCount?: number;
}

export interface AppendOptions extends LeaseCallOptions {
  /** Fail with SEQ_CONFLICT unless the first event gets this seq. */
  expectedSeq?: number;
  /** Idempotency key; a fresh UUID when absent, "" for none (and no retry). */
  requestId?: string;
  lenient?: boolean;
}

/** A failed call: the server's reason and metadata, or the status name for transport failures. */
export class SessionLogError extends Error {
  readonly code: number;
  readonly codeName: string;
  readonly reason: string;
  readonly domain: string;
  readonly metadata: Record<string, string>;
}

/**
 * NOT_PRIMARY: the server takes no writes (a replica, a fenced primary, or one at an epoch below
 * the one this client has seen). Nothing was written.
 */
export class NotPrimaryError extends SessionLogError {
  /** Where writes go, as the server knows it ("" when it knows no primary). */
  readonly primary: string;
  /** The highest leadership epoch the server knows. */
  readonly epoch: number;
}

/**
 * LEADERSHIP_LOST: the write is not acknowledged (the server lost its leadership while it was in
 * flight, or a deposed server took it). Retry with the same requestId against the current primary.
 */
export class LeadershipLostError extends SessionLogError {
  /** The write may be stored (it finds itself on a retry with its requestId if it survived). */
  readonly committed: boolean;
}

/**
 * WRONG_GROUP (a server with --shard-map): another group owns the session; nothing was done.
 * Send the call to `primary` (or any of `members` for a read).
 */
export class WrongGroupError extends SessionLogError {
  /** The group that owns the session. */
  readonly group: string;
  /** The owner group's primary ("" when the server does not know it). */
  readonly primary: string;
  /** The owner group's members. */
  readonly members: string[];
  /** The session's slot (crc32 of its UTF-8 id, mod 1024). */
  readonly slot: number;
  /** The epoch of the shard map the refusing server holds. */
  readonly mapEpoch: number;
}

/**
 * REPLICAS_UNAVAILABLE (--ack replica): committed locally: retry with the same request id is
 * safe. Fewer than `needed` replicas reported the write within --sync-timeout.
 */
export class ReplicasUnavailableError extends SessionLogError {
  /** --sync-replicas: how many replicas must hold a write before it is acknowledged. */
  readonly needed: number;
  /** How many counting replicas reported holding it in time. */
  readonly counted: number;
  /** Its change-feed position on the primary. */
  readonly position: number;
}

/** One committed write of a followed session (followSessions). */
export interface FollowedChange {
  sessionId: string;
  /** The change's change-feed position: pass it as `after` to resume after it. */
  position: number;
  /** The events it wrote, in seq order (a redaction's rewritten events, redacted). */
  events: Event[];
  /** True when the session was deleted; anything of the id after it is a new log. */
  deleted: boolean;
}

/** The changes of every followed session, resuming after `position` on reconnect (after the
 * same ends as EventStream). */
export class SessionsStream implements AsyncIterable<FollowedChange> {
  readonly prefix: string;
  readonly filter: string;
  /** The change-feed position read to (null until the server named one, when started from now). */
  position: number | null;
  caughtUp: boolean;
  reconnects: number;
  closed: boolean;
  [Symbol.asyncIterator](): AsyncIterator<FollowedChange>;
  close(): void;
}

/**
 * Events of one session from a seq on; resumes from nextSeq after UNAVAILABLE or another end of
 * the transport with no ErrorInfo (UNKNOWN, INTERNAL or CANCELLED from an RST_STREAM: a proxy
 * lost the member behind the stream, or a reloaded proxy's old process stopped; a proxy's HTTP
 * 502/503/504), and after a follow stream stayed silent for DEAD_AFTER_HEARTBEATS of its
 * heartbeat intervals. A server's own refusal (INVALID_ARGUMENT, NOT_FOUND, ...) still throws.
 */
export class EventStream implements AsyncIterable<Event> {
  readonly sessionId: string;
  readonly nextSeq: number;
  readonly caughtUp: boolean;
  readonly reconnects: number;
  /** How many of the reconnects followed a silence (the stream deemed dead). */
  readonly deadStreams: number;
  readonly closed: boolean;
  [Symbol.asyncIterator](): AsyncIterator<Event>;
  close(): void;
}

/**
 * target: one address (any gRPC target string; NOT_PRIMARY is thrown, UNAVAILABLE retried in
 * place), or the addresses of a group's members in any order (calls go to the primary: NOT_PRIMARY
 * hints are followed, a lost member is left for the next address), or omitted with
 * `cluster` and `group` (etcd names the primary). Default: 127.0.0.1:50051.
 */
export class SessionLogClient {
  constructor(target?: string | string[], options?: ClientOptions);
  /** What errors name: the address(es), or the etcd group. */
  readonly target: string;
  /** Every address this client knows, given or learnt from hints and etcd. */
  readonly members: string[];
  /** The address calls go to now (the primary as far as the client knows); null: none known. */
  readonly current: string | null;
  /**
   * The highest leadership epoch a member named in a write reply (0: none yet), of any group.
   * Each write carries the highest epoch of its session's group (sharded servers name their
   * group beside the epoch; unsharded: one epoch), so a server at a lower epoch (a deposed
   * primary) refuses it.
   */
  readonly epoch: number;
  readonly timeoutMs: number;
  close(): void;
  waitForReady(timeoutMs?: number): Promise<void>;
  /** The shard map calls are routed by (option shardMap), loaded if not yet; null without. */
  shardMap(): Promise<ShardTable | null>;

  append(sessionId: string, events: NewEvent[], options?: AppendOptions): Promise<AppendResult>;
  since(sessionId: string, options?: { seq?: number; timeoutMs?: number }): EventStream;
  /**
   * heartbeatMs (default DEFAULT_FOLLOW_HEARTBEAT_MS): the heartbeat interval asked of the server;
   * three silent intervals mean a dead stream, resumed from nextSeq. 0: the server's, no deadline.
   */
  follow(sessionId: string, options?: { seq?: number; heartbeatMs?: number }): EventStream;
  /**
   * Every session under prefix (and matching filter), change by change. after: null (default)
   * from now, 0 from the start of the feed, N after position N; follow false stops when caught up.
   */
  followSessions(options?: {
    prefix?: string;
    filter?: string;
    after?: number | null;
    follow?: boolean;
    heartbeatMs?: number;
  }): SessionsStream;
  surface(sessionId: string, options?: { atSeq?: number } & CallOptions): Promise<SurfaceResult>;
  /** Token usage totals per model; includeDescendants adds forks' own usage. */
  getUsage(
    sessionId: string,
    options?: { atSeq?: number; includeDescendants?: boolean } & CallOptions,
  ): Promise<UsageReport>;
  deriveMessages(
    sessionId: string,
    options?: { atSeq?: number; extra?: boolean; pageSize?: number; pageToken?: string } & CallOptions,
  ): Promise<DerivedMessages>;
  /** The last n derived messages, in order, read from the end of the log. */
  lastMessages(
    sessionId: string,
    n: number,
    options?: { atSeq?: number; extra?: boolean } & CallOptions,
  ): Promise<DerivedMessages>;
  /** One page of stored events, oldest first ("seq", the default) or newest first ("seq desc"). */
  listEvents(
    sessionId: string,
    options?: { pageSize?: number; pageToken?: string; orderBy?: "seq" | "seq asc" | "seq desc" } & CallOptions,
  ): Promise<EventPage>;
  /** The last n stored events, in seq order. */
  lastEvents(sessionId: string, n: number, options?: CallOptions): Promise<Event[]>;

  /** The state folded from every event's stateDelta (after events 0..atSeq with atSeq). */
  getState(sessionId: string, options?: { atSeq?: number } & CallOptions): Promise<StateResult>;
  /** Hide the surface positions [startSeq, stopSeq] (inclusive), adding no message. */
  hide(
    sessionId: string,
    startSeq: number,
    stopSeq: number,
    options?: { reason?: string; expectedSeq?: number } & CallOptions,
  ): Promise<AppendResult>;
  /** Hide the newest message and return it with its seq; undefined when none is left. */
  popLast(
    sessionId: string,
    options?: { reason?: string; extra?: boolean } & CallOptions,
  ): Promise<{ seq: number; message: ChatMessage } | undefined>;
  /** Hide every message so far; undefined (nothing written) for an empty session. */
  clear(sessionId: string, options?: { reason?: string } & CallOptions): Promise<AppendResult | undefined>;

  createSession(
    sessionId: string,
    events?: NewEvent[],
    options?: LifecycleOptions & SessionFields,
  ): Promise<{ session: Session; events: Event[] }>;
  seedSession(
    sessionId: string,
    messages: ChatMessageInput[],
    options?: LifecycleOptions,
  ): Promise<{ session: Session; events: Event[]; drops: { index: number; reason: string }[] }>;
  getSession(
    sessionId: string,
    options?: CallOptions,
  ): Promise<{ session: Session; leaseAudit: LeaseAuditEntry[] }>;
  /** One ImportSession chunk: seqs (from firstSeq when absent) and times kept; not retried. */
  importSession(
    sessionId: string,
    events?: (NewEvent & { seq?: number })[],
    options?: ImportOptions,
  ): Promise<{ session: Session; importedCount: number }>;
  listSessions(
    options?: { prefix?: string; pageSize?: number; filter?: string; orderBy?: string } & CallOptions,
  ): AsyncGenerator<SessionPage, void, undefined>;
  /** Every session's lease takeovers and forced releases, paged (an admin token, no prefix). */
  listLeaseAudit(
    options?: { prefix?: string; pageSize?: number } & CallOptions,
  ): AsyncGenerator<LeaseAuditPage, void, undefined>;
  /** Set only the fields given; labels replaces the map, setLabels/removeLabels single keys. */
  updateSession(
    sessionId: string,
    options: {
      title?: string;
      labels?: Record<string, string>;
      owner?: string;
      status?: string;
      setLabels?: Record<string, string>;
      removeLabels?: string[];
      /** Expire this long from now (not with expireTime). */
      ttlMs?: number;
      /** Expire at this time; null: never. */
      expireTime?: Time | Date | null;
      pinned?: boolean;
    } & CallOptions,
  ): Promise<Session>;
  /** The sub-agent children and forks of a session, in id order. */
  children(sessionId: string, options?: CallOptions): Promise<Session[]>;
  forkSession(
    parentSessionId: string,
    options?: { atSeq?: number; sessionId?: string } & LifecycleOptions,
  ): Promise<{ session: Session }>;
  acquireLease(
    sessionId: string,
    holder: string,
    options?: { ttlMs?: number } & CallOptions,
  ): Promise<{ lease: Lease }>;
  renewLease(
    sessionId: string,
    holder: string,
    options?: { ttlMs?: number } & CallOptions,
  ): Promise<{ lease: Lease }>;
  releaseLease(
    sessionId: string,
    holder: string,
    options?: { force?: boolean } & CallOptions,
  ): Promise<{ released?: Lease }>;
  deleteSession(
    sessionId: string,
    options?: { expectedSeq?: number; leaseHolder?: string; force?: boolean; reason?: string } & CallOptions,
  ): Promise<{ session: Session; eventCount: number; position: number }>;
  redactEvents(
    sessionId: string,
    seqs: number[],
    options?: { reason?: string; leaseHolder?: string } & CallOptions,
  ): Promise<{ seqs: number[]; position: number }>;
}

export const DEFAULT_PROTO_DIR: string;
export const DEFAULT_TARGET: string;
/** `address` when it is HOST:PORT or a gRPC target with a scheme; throws a TypeError for a
 * bare host (gRPC would dial port 443). The constructor checks every address given. */
export function checkAddress(address: string): string;
export const DEFAULT_TIMEOUT_MS: number;
export const DEFAULT_MAX_MESSAGE_BYTES: number;
export const DEFAULT_FOLLOW_HEARTBEAT_MS: number;
export const DEAD_AFTER_HEARTBEATS: number;
export const DEFAULT_REPLICAS_RETRIES: number;
/** "sessionlog-epoch": the metadata that carries epochs on writes (both ways). */
export const EPOCH_KEY: string;
/** "sessionlog-epoch-group": beside EPOCH_KEY on a sharded server's replies and on writes, the group. */
export const EPOCH_GROUP_KEY: string;
/** "x-session-id": the metadata naming a call's session, sent on every call that names one. */
export const SESSION_HEADER: string;
/** The x-session-id value of an id: itself when plain ASCII, else percent-encoded UTF-8. */
export function sessionHeader(sessionId: string): string;

export function eventTypeName(type: string): string;
/** "etcd://HOST:PORT[,HOST:PORT...]" -> ["HOST:PORT", ...]. */
export function parseCluster(cluster: string): string[];
/** "/sessionlog/groups/GROUP/leader". */
export function leaderKey(group: string): string;
/** The group's leader (HOST:PORT) from etcd's JSON gateway, or null when it has none now. */
export function readLeader(
  endpoints: string[],
  group: string,
  options?: { timeoutMs?: number },
): Promise<string | null>;
export function eventFromMessage(message: ChatMessageInput): NewEvent;
export function fromMessage(raw: unknown, options?: { extra?: boolean }): ChatMessage;
export function toMessage(message: ChatMessageInput): unknown;
export function toEvent(event: NewEvent): unknown;
export function fromEvent(raw: unknown): Event;
export function toStruct(object: JsonObject): unknown;
export function fromStruct(struct: unknown): JsonObject;
export function toTimestamp(time: Time | Date): { seconds: number; nanos: number };
export function fromTimestamp(stamp: { seconds?: number; nanos?: number } | null | undefined): Time | undefined;
export function errorInfo(
  error: unknown,
): { reason: string; domain: string; metadata: Record<string, string> } | null;
export function toError(error: unknown): unknown;
/** The HTTP status (502, 503, 504) a proxy answered a call with in place of a server, or null. */
export function proxyStatus(error: unknown): number | null;
