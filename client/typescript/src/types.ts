// The plain shapes of sessionlog's Node client: what its methods take and return. No code, no
// imports but proto.ts's generated types: the lowest layer (see index.ts for the layers).

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
  /** Names this incarnation of the session: a session deleted and made again has another. */
  uid: string;
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
  /** The state after the whole log: set only by listSessions with view "full". */
  state?: JsonObject;
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
  /** The session's uid (Session.uid); "" when the session does not exist. */
  sessionUid: string;
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
  /** The session's uid when the page was read ("" for a session never written). */
  sessionUid: string;
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

export interface CallOptions {
  timeoutMs?: number;
}

export interface LeaseCallOptions extends CallOptions {
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
  /** Set the session's title in the same commit as the events ("" clears it; absent: untouched). */
  title?: string;
  /** Fail with SESSION_UID_MISMATCH unless the session's uid is this (a session deleted and made
   * again has another): the sessionUid of an earlier write or Session.uid. */
  expectedUid?: string;
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
