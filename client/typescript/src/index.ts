// sessionlog's Node client: a thin typed wrapper over @grpc/grpc-js, reading proto/ at run time
// with @grpc/proto-loader (see README.md for why); the messages' shapes are typed by proto.ts,
// generated from proto/.
//
//   import { SessionLogClient } from "sessionlog-client";
//   const client = new SessionLogClient("127.0.0.1:50051");
//   await client.append("demo", [{ type: "user_message", data: { content: "hi" } }]);
//   for await (const event of client.follow("demo")) console.log(event.seq, event.data);

import { randomUUID } from "node:crypto";
import { existsSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

import { AppendStream, type AppendStreamOptions } from "./append-stream.js";
import {
  errorInfo,
  type Failure,
  LeadershipLostError,
  proxyStatus,
  SessionLogError,
  type SessionLogErrorOptions,
  toError,
  undecodable,
  undecodableReply,
  whole,
} from "./errors.js";
import type * as proto from "./proto.js";
import type { Input } from "./proto.js";
import type {
  AppendOptions,
  AppendResult,
  CallOptions,
  ChatMessage,
  ChatMessageInput,
  ClientOptions,
  DerivedMessages,
  Event,
  EventPage,
  EventTypeName,
  FollowedChange,
  ImportOptions,
  Json,
  JsonObject,
  Lease,
  LeaseAuditEntry,
  LeaseAuditPage,
  LeaseCallOptions,
  LifecycleOptions,
  ModelUsage,
  NewEvent,
  RetryOptions,
  Role,
  Session,
  SessionFields,
  SessionLeaseAuditEntry,
  SessionPage,
  ShardGroup,
  StateResult,
  SurfaceResult,
  Time,
  Usage,
  UsageInput,
  UsageReport,
} from "./types.js";
import {
  appendRequest,
  appendResult,
  checkPageSize,
  checkSeq,
  fromEvent,
  fromStruct,
  fromTimestamp,
  refused,
  toEvent,
  toStruct,
  toTimestamp,
  usageCounts,
} from "./values.js";

// The layers (no import circle; tests/unit/test_layers.py checks): types, errors, values,
// append-stream, index, then the framework adapters (claude-agent-sdk, langgraph, openai-agents).
export { AppendStream, type AppendStreamOptions, DEFAULT_MAX_IN_FLIGHT, type StreamAppendOptions } from "./append-stream.js";
export {
  DataCorruptedError,
  errorFor,
  errorInfo,
  LeadershipLostError,
  NotPrimaryError,
  proxyStatus,
  ReplicasUnavailableError,
  SessionLogError,
  type SessionLogErrorOptions,
  toError,
  WrongGroupError,
} from "./errors.js";
export type { Input } from "./proto.js";
export type * from "./types.js";
/** @internal */
export { appendRequest, appendResult } from "./values.js";
export {
  eventTypeName,
  fromEvent,
  fromStruct,
  fromTimestamp,
  toEvent,
  toStruct,
  toTimestamp,
} from "./values.js";

/** The RPCs of both services, by method name: request, response and streaming kind. */
type Methods = proto.SessionLogServiceMethods & proto.AdminServiceMethods;
type UnaryMethod = { [M in keyof Methods]: Methods[M]["kind"] extends "unary-unary" ? M : never }[keyof Methods];

const HERE = dirname(fileURLToPath(import.meta.url));
/** The package's proto/ (npm pack copies it in), else the repository's (src -> ../../../proto). */
const PACKAGED_PROTO_DIR = resolve(HERE, "..", "proto");
export const DEFAULT_PROTO_DIR = existsSync(PACKAGED_PROTO_DIR)
  ? PACKAGED_PROTO_DIR
  : resolve(HERE, "..", "..", "..", "proto");
export const DEFAULT_TARGET = "127.0.0.1:50051";

const HOST_PORT = /^(\[[^\]]+\]|[^:[\]/]+):(\d{1,5})$/;
const SCHEMES = ["unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:"];

/** `address` when it is HOST:PORT ([v6]:PORT) or a gRPC target with a scheme (dns:///HOST:PORT,
 * unix:...); a TypeError for a bare host (also after dns:), to which gRPC would silently dial
 * port 443, and for a URL (http://...), which is no gRPC target. */
export function checkAddress(address: string): string {
  if (/^(https?|grpc):\/\//.test(address)) {
    throw new TypeError(
      `a target is HOST:PORT, e.g. 127.0.0.1:50051 (got ${JSON.stringify(address)}): a URL is not a gRPC target; drop the scheme (TLS is the client's tls option)`,
    );
  }
  if (address.startsWith("dns:")) {
    let name = address.slice("dns:".length);
    if (name.startsWith("//")) {
      const slash = name.indexOf("/", 2);
      name = slash < 0 ? "" : name.slice(slash + 1);
    }
    hostPort(name, address);
  } else if (!(address.includes(":/") || SCHEMES.some((s) => address.startsWith(s)))) {
    hostPort(address, address);
  }
  return address;
}

function hostPort(name: string, address: string): void {
  const match = HOST_PORT.exec(name);
  const port = match ? Number(match[2]) : 0;
  if (!(port > 0 && port < 65536)) {
    throw new TypeError(
      `a target is HOST:PORT, e.g. 127.0.0.1:50051 (got ${JSON.stringify(address)}); a bare host would dial port 443`,
    );
  }
}
export const DEFAULT_TIMEOUT_MS = 10_000;
export const DEFAULT_CONNECT_TIMEOUT_MS = 3_000;
/** The server allows 4 MiB by default; accept far more so a raised limit needs no change here. */
export const DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
/** The heartbeat interval follow() asks the server for while the session is idle. */
export const DEFAULT_FOLLOW_HEARTBEAT_MS = 5_000;
/** A follow stream silent (not even a heartbeat) for this many intervals is dead: resumed. */
export const DEAD_AFTER_HEARTBEATS = 3;
// While a call is open, ping after 10 s without a frame (gRPC's advised floor; sessionlog servers
// accept pings down to every second) and drop the connection when 5 s pass with no ack, so a call
// resumed after a dead stream gets a fresh connection rather than the dead one.
const KEEPALIVE_OPTIONS: Record<string, number> = {
  "grpc.keepalive_time_ms": 10_000,
  "grpc.keepalive_timeout_ms": 5_000,
};
const ROLE_PREFIX = "ROLE_";

/** The codes with which the transport ends a call when no server error does (no ErrorInfo). */
const TRANSPORT_ENDS = new Set<number | undefined>([grpc.status.UNAVAILABLE, grpc.status.UNKNOWN, grpc.status.INTERNAL, grpc.status.CANCELLED]);

/**
 * A call ended by the transport or a proxy, not by a server's answer: a dropped connection, an
 * RST_STREAM (a proxy lost the member behind the call, or a reloaded proxy's old process
 * stopped), a proxy's HTTP status. A read stream resumes after it from where it was; a stream
 * closed by this client never gets this far.
 */
function transportEnd(error: Failure): boolean {
  return TRANSPORT_ENDS.has(error?.code) && !errorInfo(error) && !(error instanceof SessionLogError) && !undecodableReply(error);
}

// -- values -----------------------------------------------------------------------------------

/** The most a server puts in one page of ListEvents or of a paged DeriveMessages. */
const MAX_PAGE_SIZE = 1000;
/** The page size a server gives ListSessions when none is asked for. */
const LISTING_PAGE_SIZE = 100;

/**
 * The page size to ask ListSessions for again, with the same token, after a page of `pageSize`
 * sessions came back over this client's maxMessageBytes; null when a smaller page cannot help.
 * The server keeps each page within its own --max-message-size, fewer sessions than asked when
 * they are large; a client that reads less than that halves the page, down to one session.
 * Only a page with each session's state (view "full") grows with what the sessions hold.
 */
function smallerListingPage(pageSize: number, full: boolean): number | null {
  const size = pageSize || LISTING_PAGE_SIZE;
  return full && size > 1 ? Math.floor(size / 2) : null;
}

function checkCount(n: number): void {
  if (!Number.isInteger(n) || n < 0) throw refused("n", `n must be a whole number, 0 or more (got ${n})`);
}

const SHORT_ROLE = (name: string): string => String(name).slice(ROLE_PREFIX.length).toLowerCase();

/** A LeaseAuditEntry -> { kind: "LEASE_AUDIT_KIND_TAKEOVER", actor, previousHolder, previousToken, time }. */
function fromAuditEntry(a: proto.LeaseAuditEntry): LeaseAuditEntry {
  return {
    kind: a.kind,
    actor: a.actor,
    previousHolder: a.previous_holder,
    previousToken: Number(a.previous_token ?? 0),
    time: fromTimestamp(a.time),
  };
}

/** ModelUsage messages -> [{ model, inputTokens, outputTokens, cachedInputTokens, reasoningTokens, eventCount }]. */
function fromModelUsages(list: proto.ModelUsage[] | null | undefined): ModelUsage[] {
  return (list ?? []).map((u) => ({ model: u.model, ...usageCounts(u), eventCount: Number(u.event_count ?? 0) }));
}

/**
 * A derived Message -> the OpenAI chat format: role, content (null when absent; a multi-part list
 * kept in metadata.content_parts comes back as the list), tool_calls (when any), tool_call_id and
 * name (when set). With extra, also reasoning_content, metadata and created_at.
 */
export function fromMessage(raw: proto.Message, { extra = false }: { extra?: boolean } = {}): ChatMessage {
  const metadata = fromStruct(raw.metadata);
  const out: ChatMessage = { role: SHORT_ROLE(raw.role) as ChatMessage["role"], content: null };
  if (typeof raw.content === "string") out.content = raw.content;
  else if (Array.isArray(metadata.content_parts)) out.content = metadata.content_parts;
  if (raw.tool_calls?.length) out.tool_calls = raw.tool_calls.map((call) => fromStruct(call));
  if (typeof raw.tool_call_id === "string") out.tool_call_id = raw.tool_call_id;
  if (typeof raw.name === "string") out.name = raw.name;
  if (extra) {
    if (typeof raw.reasoning_content === "string") out.reasoning_content = raw.reasoning_content;
    if (Object.keys(metadata).length) out.metadata = metadata;
    if (raw.created_at) out.created_at = fromTimestamp(raw.created_at) as Time;
  }
  return out;
}

const ROLES: Record<string, proto.Role> = { system: "ROLE_SYSTEM", developer: "ROLE_SYSTEM", user: "ROLE_USER", assistant: "ROLE_ASSISTANT", tool: "ROLE_TOOL" };

/** A chat-format message -> the proto Message (for seedSession). */
export function toMessage(message: ChatMessageInput): Input<proto.Message> {
  const out: Input<proto.Message> = { role: ROLES[String(message.role).toLowerCase()] ?? "ROLE_UNSPECIFIED" };
  const metadata: JsonObject = { ...(message.metadata ?? {}) };
  if (Array.isArray(message.content)) metadata.content_parts = message.content;
  else if (message.content !== null && message.content !== undefined) out.content = String(message.content);
  for (const key of ["reasoning_content", "tool_call_id", "name"] as const) {
    if (message[key] !== null && message[key] !== undefined) out[key] = String(message[key]);
  }
  if (message.tool_calls?.length) out.tool_calls = message.tool_calls.map((call) => toStruct(call));
  if (Object.keys(metadata).length) out.metadata = toStruct(metadata);
  if (message.created_at !== undefined) out.created_at = toTimestamp(message.created_at);
  return out;
}

/** A chat message (e.g. a model's reply) -> the surface event that projects back to it. */
export function eventFromMessage(message: ChatMessageInput): NewEvent {
  const proto = toMessage(message);
  const types: Record<string, EventTypeName> = { ROLE_SYSTEM: "system_message", ROLE_USER: "user_message", ROLE_ASSISTANT: "assistant_message", ROLE_TOOL: "tool_result" };
  const type = types[proto.role ?? ""];
  if (!type) throw new TypeError(`no event type for role ${message.role}`);
  const data: JsonObject = {};
  for (const key of ["content", "reasoning_content", "tool_call_id", "name"] as const) {
    if (key in proto) data[key] = proto[key] ?? null;
  }
  if (message.tool_calls?.length) data.tool_calls = message.tool_calls;
  if (proto.metadata) data.metadata = fromStruct(proto.metadata as proto.Struct);
  const event: NewEvent = { type, data };
  if (message.created_at !== undefined) event.time = message.created_at;
  return event;
}

function fromSession(raw: proto.Session | null | undefined): Session {
  if (!raw) return undefined as unknown as Session;
  return {
    sessionId: raw.session_id,
    exists: Boolean(raw.exists),
    eventCount: Number(raw.event_count ?? 0),
    replaceGeneration: Number(raw.replace_generation ?? 0),
    createTime: fromTimestamp(raw.create_time),
    lastAppendTime: fromTimestamp(raw.last_append_time),
    parentSessionId: raw.parent_session_id ?? "",
    parentEventCount: Number(raw.parent_event_count ?? 0),
    uid: raw.uid ?? "",
    lease: fromLease(raw.lease),
    usage: fromModelUsages(raw.usage),
    title: raw.title ?? "",
    labels: { ...(raw.labels ?? {}) },
    owner: raw.owner ?? "",
    status: raw.status ?? "",
    updateTime: fromTimestamp(raw.update_time),
    parentSeq: raw._parent_seq === "parent_seq" ? Number(raw.parent_seq) : undefined,
    expireTime: fromTimestamp(raw.expire_time),
    pinned: Boolean(raw.pinned),
    ...(raw.state ? { state: fromStruct(raw.state) } : {}),
  };
}

function fromLease(raw: proto.Lease | null | undefined): Lease | undefined {
  if (!raw) return undefined;
  return {
    holder: raw.holder,
    token: Number(raw.token ?? 0),
    acquireTime: fromTimestamp(raw.acquire_time),
    expireTime: fromTimestamp(raw.expire_time),
  };
}

function duration(ttlMs: number | null | undefined): { seconds: number; nanos: number } | undefined {
  if (ttlMs === undefined || ttlMs === null) return undefined;
  const seconds = Math.floor(ttlMs / 1000);
  return { seconds, nanos: Math.round((ttlMs - seconds * 1000) * 1e6) };
}

// -- retries ----------------------------------------------------------------------------------

/** How a unary call is sent (_call): retried or not, a write (epochs), to AdminService. */
interface SendOptions {
  timeoutMs?: number;
  retry?: boolean;
  write?: boolean;
  admin?: boolean;
}

/** Tries after the first of a call that met REPLICAS_UNAVAILABLE (each waited --sync-timeout). */
export const DEFAULT_REPLICAS_RETRIES = 2;

class Backoff {
  giveUpAfterMs: number;
  initialBackoffMs: number;
  maxBackoffMs: number;
  started: number | null = null;
  delay = 0;

  constructor({ giveUpAfterMs = 30_000, initialBackoffMs = 50, maxBackoffMs = 1000 }: RetryOptions = {}) {
    this.giveUpAfterMs = giveUpAfterMs;
    this.initialBackoffMs = initialBackoffMs;
    this.maxBackoffMs = maxBackoffMs;
    this.reset();
  }

  reset() {
    this.started = null;
    this.delay = this.initialBackoffMs;
  }

  /** The next sleep in ms, or null once the budget (or the smaller budgetMs) is spent. */
  next(budgetMs: number | null = null): number | null {
    const now = Date.now();
    this.started ??= now;
    const limit = budgetMs === null ? this.giveUpAfterMs : Math.min(budgetMs, this.giveUpAfterMs);
    const remaining = limit - (now - this.started);
    if (remaining <= 0) return null;
    const delay = this.delay * (0.5 + Math.random() / 2);
    this.delay = Math.min(this.delay * 2, this.maxBackoffMs);
    return Math.min(delay, remaining);
  }
}

const sleep = (ms: number): Promise<void> => new Promise((done) => setTimeout(done, ms));

/** How long a WRONG_GROUP is retried by default (HAProxy catching up with a slot move's flip). */
export const DEFAULT_WRONG_GROUP_FOR_MS = 5000;

/** How long error may be retried when that is less than the whole budget: WRONG_GROUP's. */
function moveBudget(error: unknown, retry: RetryOptions): number | null {
  if (errorInfo(error)?.reason !== "WRONG_GROUP") return null;
  return retry.wrongGroupForMs ?? DEFAULT_WRONG_GROUP_FOR_MS;
}

// -- routing ----------------------------------------------------------------------------------
//
// A client keeps one channel per address it knows and a current member, the primary as far as it
// knows; every call, read or write, goes to the current member (so a client reads its own writes).
// Given several addresses (an array) or an etcd cluster, these answers move it:
//   NOT_PRIMARY naming a primary     that address becomes current (added if new) and the call is
//                                    sent again at once: a refused write wrote nothing, so this
//                                    holds for every write, retried or not
//   NOT_PRIMARY with no primary      "no primary known": the next address becomes current (etcd is
//                                    read first, when given); the call waits its backoff
//   UNAVAILABLE from a member that   the same move; only calls that retry UNAVAILABLE try again
//   answered before
//   UNAVAILABLE from an address that the next address at once; when no address has ever answered
//   never answered                   and each was tried, the call rejects naming them all
//   DEADLINE_EXCEEDED, no answer     a retried unary call moves on as after UNAVAILABLE: a frozen
//                                    primary holds a call until its deadline, and the group may
//                                    have a new primary by then
// Immediate re-sends within one call are bounded (2 per member + 2); past that each move waits its
// backoff, and the call gives up after retry.giveUpAfterMs like any retry. With one address given
// as a string and no etcd, nothing moves: NOT_PRIMARY is thrown and UNAVAILABLE retried in place.
//
// Epochs: every write's reply, success or error, carries the server's leadership epoch (trailing
// metadata sessionlog-epoch; NOT_PRIMARY's metadata epoch too). The client keeps the highest seen
// (client.epoch) and sends it with every write, so a server at a lower epoch (a deposed primary
// restarted unfenced) refuses the write with NOT_PRIMARY and writes nothing. A member answering
// with a lower epoch is never taken for the primary: its NOT_PRIMARY hint is ignored and the next
// address tried at once; a write it acknowledged anyway (a server too old to refuse) is not an
// acknowledgement: sent again elsewhere if the call retries, else LeadershipLostError.
// Per group: a sharded server names its group beside its epoch (sessionlog-epoch-group); groups
// elect their leaders apart, so the client keeps the highest epoch per group ("": a server that
// names none, not sharded: one epoch, as before), remembers the group each session's slot last
// answered from, and sends a write the epoch of that group with the group's name (nothing while
// that group's epoch is unknown). Through a proxy serving several groups, one client so never
// sends one group's epoch to another; deposed is judged within the group.
// A slot move's refusals (sharded servers) move nothing either: SLOT_MOVING is waited out on the
// same member by every call, and WRONG_GROUP too (for retry.wrongGroupForMs), unless the client
// routes by a shard map (its group clients raise it to the shard routing, which reroutes it).
//
// REPLICAS_UNAVAILABLE is no reason to move (the write is committed on this member, the primary):
// a retried call sends it again there at most retry.replicasRetries times.

/** What a failed call does next (_after): send again at once, after a backoff, or throw. */
type Step = "again" | "later" | "raise";
const AGAIN: Step = "again";
/** The option that marks the group clients a shardMap client makes (not a public option). */
const GROUP_CLIENT = Symbol("groupClient");
const LATER: Step = "later";
const RAISE: Step = "raise";
const PRIMARY_HINT = "primary";
export const EPOCH_KEY = "sessionlog-epoch";
/** Beside EPOCH_KEY on a sharded server's write replies (and a client's writes): the group. */
export const EPOCH_GROUP_KEY = "sessionlog-epoch-group";

/**
 * "x-session-id": the metadata that names a call's session (a fork's source), sent on every call
 * that names one, so a proxy can route it to the session's shard group without reading the body.
 */
export const SESSION_HEADER = "x-session-id";

/**
 * The x-session-id value of a session id: the id itself when it is plain ASCII (A-Za-z0-9_.-),
 * else its UTF-8 bytes percent-encoded (gRPC metadata values are printable ASCII only).
 */
export function sessionHeader(sessionId: string): string {
  return encodeURIComponent(sessionId);
}

/**
 * The session a request names: an update's session, a fork's source (a sub-agent child's
 * parent, in the same group), else its session_id ("" for none).
 */
function sessionOf(request: object): string {
  const named = request as { session?: { session_id?: string | null } | null; parent_session_id?: string | null; session_id?: string | null };
  if (named.session !== undefined) return named.session?.session_id ?? "";
  return named.parent_session_id || named.session_id || "";
}
const ETCD_SCHEME = "etcd://";

/** "etcd://HOST:PORT[,HOST:PORT...]" (the server's --cluster form) -> the endpoints. */
export function parseCluster(cluster: string): string[] {
  if (!String(cluster).startsWith(ETCD_SCHEME)) {
    throw new TypeError(`cluster must look like etcd://HOST:PORT[,HOST:PORT...], not ${JSON.stringify(cluster)}`);
  }
  const endpoints = cluster.slice(ETCD_SCHEME.length).split(",").map((e) => e.trim()).filter(Boolean);
  if (!endpoints.length) throw new TypeError(`cluster ${JSON.stringify(cluster)} names no etcd endpoint`);
  return endpoints;
}

/** The etcd key a group's leader holds under its lease; its value is the leader's HOST:PORT. */
export function leaderKey(group: string): string {
  if (!group || String(group).includes("/")) throw new TypeError(`group must be a non-empty name without '/', not ${JSON.stringify(group)}`);
  return `/sessionlog/groups/${group}/leader`;
}

/**
 * The leader of a group from the first etcd endpoint that answers, through etcd's JSON gateway
 * (POST /v3/kv/range, base64 keys; etcd 3.4 and later): its HOST:PORT, or null when the group has
 * no leader now. Rejects with UNAVAILABLE naming every endpoint when none answers.
 */
export async function readLeader(
  endpoints: string[],
  group: string,
  { timeoutMs = DEFAULT_CONNECT_TIMEOUT_MS }: { timeoutMs?: number } = {},
): Promise<string | null> {
  const value = await readKey(endpoints, leaderKey(group), `the leader of group ${JSON.stringify(group)}`, timeoutMs);
  return value?.trim() || null;
}

/** The value of an etcd key (UTF-8) from the first endpoint that answers; null when absent. */
async function readKey(endpoints: string[], key: string, what: string, timeoutMs: number): Promise<string | null> {
  const body = JSON.stringify({ key: Buffer.from(key).toString("base64") });
  const failures: string[] = [];
  for (const endpoint of endpoints) {
    let answer: { kvs?: { value?: string }[] } | null;
    try {
      const reply = await fetch(`http://${endpoint}/v3/kv/range`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body,
        signal: AbortSignal.timeout(timeoutMs),
      });
      if (!reply.ok) throw new Error(`HTTP ${reply.status}`);
      answer = await reply.json();
    } catch (error) {
      const failed = error as { cause?: { code?: string }; message?: string } | null;
      failures.push(`${endpoint}: ${failed?.cause?.code ?? failed?.message ?? error}`);
      continue;
    }
    const value = answer?.kvs?.[0]?.value;
    if (!value) return null;
    return Buffer.from(value, "base64").toString("utf8");
  }
  throw new SessionLogError(`cannot read ${what} from etcd: ${failures.join("; ")}`, {
    code: grpc.status.UNAVAILABLE,
    reason: "UNAVAILABLE",
  });
}

/** The epoch a reply's trailing metadata names (0: none). */
function trailingEpoch(metadata: grpc.Metadata | null | undefined): number {
  return whole(metadata?.get?.(EPOCH_KEY)?.[0]);
}

/** The group a sharded server's reply names beside its epoch ("": none, not sharded). */
function trailingGroup(metadata: grpc.Metadata | null | undefined): string {
  const value = metadata?.get?.(EPOCH_GROUP_KEY)?.[0];
  return value === undefined ? "" : String(value);
}

/** The error a call rejects with when no address it tried has ever answered. */
function unreachable(members: Member[], error: Failure): SessionLogError {
  const details = String(error.details || error.message).split(/\s+/).join(" ");
  const where = members.map((m) => m.address).join(", ");
  return new SessionLogError(`cannot reach a sessionlog server at ${where}: ${details}`, {
    code: grpc.status.UNAVAILABLE,
    reason: "UNAVAILABLE",
    cause: error,
  });
}

/** What a follow stream throws when it kept going silent until its retry budget ran out. */
function deadStream(silenceMs: number, cause: unknown): SessionLogError {
  return new SessionLogError(
    `the follow stream heard nothing, not even a heartbeat, for ${silenceMs} ms each time it ` +
      "reconnected: the server or the link to it is down",
    { code: grpc.status.UNAVAILABLE, cause },
  );
}

// -- shard routing -----------------------------------------------------------------------------
// Sessions spread over groups by slot: slot = crc32(UTF-8 id) % 1024 (the server's
// sessionlog.shard.slots; zlib's CRC-32, IEEE). With the option shardMap ("server": GetShardMap
// from the address given; "etcd://HOST:PORT[,...]": etcd's /sessionlog/shards, the JSON the
// servers read) the client keeps one client per group (primary first: its own routing finds the
// primary and follows failovers) and sends each call that names a session to the owner's. A
// WRONG_GROUP refusal reloads the map from the server that refused (a newer epoch wins), else
// takes the owner the refusal names (ErrorInfo group, primary, members, map_epoch), and sends the
// call there once; a follow stream goes on there from its nextSeq.

export const SLOTS = 1024;
export const SHARDS_KEY = "/sessionlog/shards";
const WRONG_GROUP = "WRONG_GROUP";

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

/** CRC-32 (IEEE, as zlib, Go's ChecksumIEEE and HAProxy's crc32) of bytes. */
export function crc32(bytes: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** The slot of a session id: crc32 of its UTF-8 bytes, modulo SLOTS. */
export function slotOf(sessionId: string): number {
  return crc32(Buffer.from(sessionId, "utf8")) % SLOTS;
}

/** A group's addresses, its primary first. */
function groupAddresses(group: ShardGroup): string[] {
  return group.primary ? [group.primary, ...group.members.filter((m) => m !== group.primary)] : [...group.members];
}

/** A shard map as the client routes by it: groups { name, members, ranges: [[first, last]], primary }. */
export class ShardTable {
  readonly epoch: number;
  readonly groups: ShardGroup[];
  private readonly _owners: Int32Array;

  constructor(epoch: number, groups: ShardGroup[]) {
    this.epoch = epoch;
    this.groups = groups;
    this._owners = new Int32Array(SLOTS).fill(-1);
    groups.forEach((group, index) => {
      if (!group.name || groups.findIndex((g) => g.name === group.name) !== index) {
        throw new TypeError(`group name ${JSON.stringify(group.name)} is empty or repeated`);
      }
      for (const [first, last] of group.ranges) {
        if (!(Number.isInteger(first) && Number.isInteger(last) && 0 <= first && first <= last && last < SLOTS)) {
          throw new TypeError(`group ${group.name}: slots ${first}-${last} out of range`);
        }
        for (let slot = first; slot <= last; slot++) {
          if (this._owners[slot] !== -1) throw new TypeError(`slot ${slot} is owned twice`);
          this._owners[slot] = index;
        }
      }
    });
    const missing = this._owners.indexOf(-1);
    if (missing !== -1) throw new TypeError(`slot ${missing} has no owner`);
  }

  /** The group that owns sessionId. */
  owner(sessionId: string): ShardGroup {
    return this.groups[this._owners[slotOf(sessionId)]];
  }

  /** This map with sessionId's slot given to group (a WRONG_GROUP's word for it), at epoch. */
  withOwner(sessionId: string, group: ShardGroup, epoch: number): ShardTable {
    const slot = slotOf(sessionId);
    const groups: ShardGroup[] = [];
    let known = null;
    for (const g of this.groups) {
      if (g.name === group.name) {
        known = g;
        continue;
      }
      const ranges: [number, number][] = [];
      for (const [first, last] of g.ranges) {
        if (first <= slot && slot <= last) {
          if (first < slot) ranges.push([first, slot - 1]);
          if (slot < last) ranges.push([slot + 1, last]);
        } else ranges.push([first, last]);
      }
      groups.push({ ...g, ranges });
    }
    const ranges = [...(known?.ranges ?? []), [slot, slot] as [number, number]].sort((x, y) => x[0] - y[0]);
    groups.push({ ...group, ranges });
    return new ShardTable(Math.max(epoch, this.epoch), groups);
  }

  /** From a GetShardMap reply; null for an unsharded server (epoch 0). */
  static fromReply(reply: unknown): ShardTable | null {
    const map = (reply as proto.GetShardMapResponse | null)?.shard_map;
    if (!map || !Number(map.epoch)) return null;
    return new ShardTable(
      Number(map.epoch),
      (map.groups ?? []).map((g) => ({
        name: g.name,
        members: [...(g.members ?? [])],
        ranges: (g.slot_ranges ?? []).map((r): [number, number] => [Number(r.first ?? 0), Number(r.last ?? 0)]),
        primary: g.primary ?? "",
      })),
    );
  }

  /** From etcd's JSON form: { epoch, groups: { NAME: { members, slots: ["0-511", ...] } } }. */
  static fromJson(text: string): ShardTable {
    const data = JSON.parse(text);
    if (!Number.isInteger(data?.epoch) || data.epoch < 1 || typeof data.groups !== "object") {
      throw new TypeError("a shard map is an object with an epoch of at least 1 and groups");
    }
    return new ShardTable(
      data.epoch,
      Object.entries(data.groups as Record<string, { members?: string[]; slots?: unknown[] } | null>).map(([name, body]) => ({
        name,
        members: [...(body?.members ?? [])],
        ranges: (body?.slots ?? []).map((item): [number, number] => {
          const [first, last = first] = String(item).split("-").map(Number);
          return [first, last];
        }),
        primary: body?.members?.[0] ?? "",
      })),
    );
  }
}

/** The owner a WRONG_GROUP names and its map's epoch; null when it names no address. */
function ownerFromError(metadata: Record<string, string> = {}): { group: ShardGroup; epoch: number } | null {
  const name = metadata.group ?? "";
  const members = String(metadata.members ?? "").split(",").filter(Boolean);
  const primary = metadata.primary ?? "";
  if (!name || !(members.length || primary)) return null;
  return { group: { name, members, ranges: [], primary }, epoch: whole(metadata.map_epoch) };
}

/** After a WRONG_GROUP: the map to keep and the owner to go to (null: none named). */
export function afterWrongGroup(
  before: ShardTable | null,
  newer: ShardTable | null,
  sessionId: string,
  metadata: Record<string, string>,
): { table: ShardTable | null; owner: ShardGroup | null } {
  let table = newer && (!before || newer.epoch > before.epoch) ? newer : before;
  const named = ownerFromError(metadata);
  if (named) {
    if (!table) return { table: null, owner: named.group };
    // Not from a map older than the one kept: a server not yet at the newer epoch would undo it.
    if (table.owner(sessionId).name !== named.group.name && named.epoch >= table.epoch) {
      table = table.withOwner(sessionId, named.group, named.epoch);
    }
  }
  return { table, owner: table ? table.owner(sessionId) : null };
}

class Shards {
  private readonly _bootstrap: SessionLogClient;
  private readonly _etcd: string[];
  private readonly _make: (members: string[]) => SessionLogClient;
  table: ShardTable | null;
  private _loading: Promise<ShardTable | null> | null;
  private readonly _clients: Map<string, SessionLogClient>;

  constructor(bootstrap: SessionLogClient, source: string, make: (members: string[]) => SessionLogClient) {
    this._bootstrap = bootstrap;
    this._etcd = source === "server" ? [] : parseCluster(source);
    this._make = make;
    this.table = null;
    this._loading = null;
    this._clients = new Map();
  }

  async load(): Promise<ShardTable | null> {
    this._loading ??= this._read(this._bootstrap).then((table) => {
      this.table = table;
      return table;
    });
    try {
      await this._loading;
      return this.table;
    } catch (error) {
      this._loading = null; // try again at the next call
      throw error;
    }
  }

  async clientFor(sessionId: string): Promise<SessionLogClient> {
    await this.load();
    return this.table ? this._clientOf(this.table.owner(sessionId)) : this._bootstrap;
  }

  async afterWrongGroup(sessionId: string, error: SessionLogError, refusedBy: SessionLogClient): Promise<SessionLogClient | null> {
    let newer = null;
    try {
      newer = await this._read(refusedBy);
    } catch {
      newer = null;
    }
    const { table, owner } = afterWrongGroup(this.table, newer, sessionId, error.metadata);
    if (table) this.table = table;
    if (!owner) return null;
    const client = this._clientOf(owner);
    return client === refusedBy ? null : client;
  }

  _clientOf(group: ShardGroup): SessionLogClient {
    const addresses = groupAddresses(group);
    const key = `${group.name}\n${[...new Set(addresses)].sort().join(",")}`;
    let client = this._clients.get(key);
    if (!client) {
      client = this._make(addresses);
      this._clients.set(key, client);
    }
    return client;
  }

  async _read(client: SessionLogClient): Promise<ShardTable | null> {
    if (this._etcd.length) {
      const value = await readKey(this._etcd, SHARDS_KEY, "the shard map", client.connectTimeoutMs);
      return value === null ? null : ShardTable.fromJson(value);
    }
    return ShardTable.fromReply(await client._call("GetShardMap", {}, { retry: true }));
  }

  close() {
    for (const client of this._clients.values()) client.close();
  }
}

// -- the client -------------------------------------------------------------------------------

/** A member's client: a grpc-js client whose RPC methods are added from the .proto files. */
type ServiceClient = grpc.Client;
type ServiceClass = grpc.ServiceClientConstructor;
type UnaryRpc = (
  request: unknown,
  metadata: grpc.Metadata,
  options: grpc.CallOptions,
  callback: (error: grpc.ServiceError | null, value?: unknown) => void,
) => grpc.ClientUnaryCall;
/** A call's options; grpc-js also reads waitForReady (gRPC's wait-for-ready). */
type RpcOptions = grpc.CallOptions & { waitForReady?: boolean };
type StreamRpc = (request: unknown, metadata: grpc.Metadata, options: grpc.CallOptions) => grpc.ClientReadableStream<unknown>;

/** A server this client knows: its channel's stub and what it has shown of itself. */
interface Member {
  address: string;
  stub: ServiceClient;
  admin?: ServiceClient;
  reached: boolean;
  failed: boolean;
  epoch: number;
}

/** A server-streaming RPC of stub (Since, FollowSessions), typed by its messages. */
function streamRpc<M extends "Since" | "FollowSessions">(
  stub: ServiceClient,
  method: M,
): (request: Input<Methods[M]["request"]>, metadata: grpc.Metadata, options: grpc.CallOptions) => grpc.ClientReadableStream<Methods[M]["response"]> {
  const rpc = (stub as unknown as Record<string, StreamRpc>)[method];
  return rpc.bind(stub) as ReturnType<typeof streamRpc<M>>;
}

let cachedPackage: { protoDir: string; services: { log: ServiceClass; admin: ServiceClass } } | null = null;

/** The SessionLogService and AdminService client classes, from protoDir's .proto files. */
function loadServices(protoDir: string): { log: ServiceClass; admin: ServiceClass } {
  if (cachedPackage?.protoDir === protoDir) return cachedPackage.services;
  const file = resolve(protoDir, "sessionlog", "v1", "session_log_service.proto");
  if (!existsSync(file)) throw new Error(`no ${file}: pass { protoDir } (the repository's proto/ folder)`);
  const files = ["sessionlog/v1/session_log_service.proto", "sessionlog/v1/admin_service.proto"];
  const definition = protoLoader.loadSync(files, {
    includeDirs: [protoDir],
    keepCase: true,
    longs: Number,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const v1 = (grpc.loadPackageDefinition(definition).sessionlog as grpc.GrpcObject).v1 as grpc.GrpcObject;
  const services = { log: v1.SessionLogService as ServiceClass, admin: v1.AdminService as ServiceClass };
  cachedPackage = { protoDir, services };
  return services;
}

/**
 * A stream of one session's events from a seq on, as an async iterator. On UNAVAILABLE (server
 * restart, dropped connection) or another end of the transport (transportEnd: a proxy's RST_STREAM
 * when the member behind the stream died or a reloaded proxy's old process stopped, a proxy's
 * HTTP 502/503/504), and when a follow stream hears nothing, not even a heartbeat,
 * for DEAD_AFTER_HEARTBEATS of the intervals it asked for (a dead link), it reconnects from
 * nextSeq, the seq after the last event it delivered: no gap, no duplicate. close() or breaking
 * out of the loop ends it. Time the caller spends on an event does not count as silence.
 * batches() reads the same events a reply at a time.
 */
export class EventStream implements AsyncIterable<Event> {
  readonly sessionId: string;
  /** The seq after the last event delivered: where a reconnect resumes. */
  nextSeq: number;
  caughtUp: boolean;
  reconnects: number;
  /** How many of the reconnects followed a silence (the stream deemed dead). */
  deadStreams: number;
  closed: boolean;
  /** @internal */
  _client: SessionLogClient;
  private readonly _follow: boolean;
  private readonly _timeoutMs: number | undefined;
  private readonly _heartbeatMs: number;
  private _call: grpc.ClientReadableStream<unknown> | null;
  private _wake: (() => void) | null;
  private _iterator: AsyncGenerator<Event, void, undefined> | null;
  private _batches: AsyncGenerator<Event[], void, undefined> | null;
  /** @internal */
  _forget: (() => void) | null;

  /** @internal */
  constructor(
    client: SessionLogClient | null,
    sessionId: string,
    seq: number,
    follow: boolean,
    timeoutMs: number | undefined,
    heartbeatMs = 0,
  ) {
    this.sessionId = sessionId;
    this.nextSeq = seq;
    this.caughtUp = false;
    this.reconnects = 0;
    this.deadStreams = 0;
    this.closed = false;
    this._client = client as SessionLogClient; // a ShardedStream sets its owner's as it starts
    this._follow = follow;
    this._timeoutMs = timeoutMs;
    this._heartbeatMs = follow ? heartbeatMs : 0;
    this._call = null;
    this._wake = null;
    this._iterator = null;
    this._batches = null;
    this._forget = null;
  }

  [Symbol.asyncIterator](): AsyncIterator<Event> {
    this._iterator ??= this._events();
    return this._iterator;
  }

  /**
   * The same events a reply at a time (`for await (const batch of stream.batches())`), in seq
   * order, each array a few hundred events, never empty; it reconnects as the event iterator
   * does. A whole read costs one step of the loop per reply instead of one per event. Read a
   * stream one way, not both.
   */
  batches(): AsyncIterable<Event[]> {
    this._batches ??= this._iterate();
    const batches = this._batches;
    return { [Symbol.asyncIterator]: () => batches };
  }

  private async *_events(): AsyncGenerator<Event, void, undefined> {
    for await (const batch of this.batches()) {
      for (const event of batch) {
        this.nextSeq = event.seq + 1;
        yield event;
      }
    }
  }

  private async *_iterate(): AsyncGenerator<Event[], void, undefined> {
    try {
      yield* this._run();
    } finally {
      this.closed = true;
      this._forget?.();
    }
  }

  /** Stop the stream; a pending iteration ends (done) without an error. */
  close(): void {
    this.closed = true;
    this._call?.cancel();
    this._wake?.();
  }

  /** @internal The events, a reply's at a time. */
  async *_run(): AsyncGenerator<Event[], void, undefined> {
    const client = this._client;
    const backoff = new Backoff(client.retry);
    let hops = 0;
    while (!this.closed) {
      const member = await client._pick();
      if (!member) {
        // No primary known yet (etcd named none): wait and ask again.
        const wait = backoff.next();
        if (wait === null) throw client._nobody();
        await this._pause(wait);
        continue;
      }
      try {
        await client._settle(member, this._timeoutMs || Infinity);
      } catch (error) {
        const step = client._after(member, error, true, hops);
        hops += step === AGAIN ? 1 : 0;
        const wait = step === AGAIN ? 0 : step === LATER ? backoff.next(moveBudget(error, client.retry)) : null;
        if (wait === null) throw toError(error);
        await this._pause(wait);
        continue;
      }
      if (this.closed) return;
      const options: RpcOptions = this._timeoutMs ? { deadline: Date.now() + this._timeoutMs } : {};
      if (client.waitForReadyCalls) options.waitForReady = true;
      const request: Input<proto.SinceRequest> = { session_id: this.sessionId, seq: this.nextSeq, follow: this._follow };
      if (this._heartbeatMs) request.heartbeat_interval = duration(this._heartbeatMs);
      const call = streamRpc(member.stub, "Since")(request, client._metadata(false, this.sessionId), options);
      this._call = call;
      const silenceMs = this._heartbeatMs * DEAD_AFTER_HEARTBEATS;
      let dead = false;
      let watchdog: NodeJS.Timeout | undefined;
      const arm = () => {
        if (!silenceMs) return;
        watchdog = setTimeout(() => {
          dead = true;
          call.cancel();
        }, silenceMs);
      };
      let delay: number | null = null;
      try {
        arm();
        for await (const response of call as AsyncIterable<proto.SinceResponse>) {
          clearTimeout(watchdog);
          backoff.reset();
          hops = 0;
          member.reached = true;
          if (response.caught_up) this.caughtUp = true;
          const batch: Event[] = [];
          for (const raw of response.events ?? []) {
            const event = fromEvent(raw);
            if (event.seq >= this.nextSeq) batch.push(event); // else delivered before a reconnect
          }
          if (batch.length) {
            this.nextSeq = batch[batch.length - 1].seq + 1;
            yield batch;
          }
          arm();
        }
        return;
      } catch (error) {
        if (this.closed) return;
        if (undecodableReply(error)) {
          throw undecodable(error, `an event of session '${this.sessionId}' from seq ${this.nextSeq} on`);
        }
        let step = LATER;
        if (dead) {
          this.deadStreams += 1;
          client._moved(member);
        } else {
          step = client._after(member, error, true, hops, false, "", true);
        }
        hops += step === AGAIN ? 1 : 0;
        delay = step === AGAIN ? 0 : step === LATER ? backoff.next(moveBudget(error, client.retry)) : null;
        if (delay === null && dead) throw deadStream(silenceMs, error);
        if (delay === null) throw toError(error);
      } finally {
        clearTimeout(watchdog);
        call.cancel();
        this._call = null;
      }
      await this._pause(delay as number);
      if (this.closed) return;
      this.reconnects += 1;
    }
  }

  /** Sleep delay ms, or less if the stream is closed meanwhile. */
  private async _pause(delay: number): Promise<void> {
    await new Promise<void>((done) => {
      const timer = setTimeout(done, delay);
      this._wake = () => {
        clearTimeout(timer);
        done();
      };
    });
    this._wake = null;
  }
}

/** The checksum a FollowSessions response gives for the change at `position` (none inside a batch). */
function checksumAt(response: proto.FollowSessionsResponse, position: number): Buffer {
  const checksum = response.position_checksum;
  return position === Number(response.position ?? 0) && checksum ? checksum : Buffer.alloc(0);
}

/**
 * The changes of every followed session (client.followSessions), as an async iterator of
 * { sessionId, position, events, deleted }, in the server's change-feed order. On UNAVAILABLE,
 * another end of the transport (as EventStream) or a dead link it reconnects and asks for the changes after `position`, the last position the
 * server sent (heartbeats included): no gap, no duplicate. It sends that position's checksum too: a
 * server whose change there is another (restored from an older backup and written since, or
 * another store) fails it with HistoryDiverged instead of resuming in the middle of another
 * history. close() or breaking out ends it.
 */
export class SessionsStream implements AsyncIterable<FollowedChange> {
  readonly prefix: string;
  readonly filter: string;
  /** The change-feed position read to (null until the server named one, when started from now). */
  position: number | null;
  /** The server's checksum of the change at `position` (empty inside a batch, or before one). */
  checksum: Buffer;
  caughtUp: boolean;
  reconnects: number;
  closed: boolean;
  private readonly _client: SessionLogClient;
  private readonly _follow: boolean;
  private readonly _heartbeatMs: number;
  private _call: grpc.ClientReadableStream<unknown> | null;
  private _wake: (() => void) | null;
  private _iterator: AsyncGenerator<FollowedChange, void, undefined> | null;
  /** @internal */
  _forget: (() => void) | null;

  /** @internal */
  constructor(
    client: SessionLogClient,
    {
      prefix = "",
      filter = "",
      after = null,
      follow = true,
      heartbeatMs = 0,
    }: { prefix?: string; filter?: string; after?: number | null; follow?: boolean; heartbeatMs?: number } = {},
  ) {
    this.prefix = prefix;
    this.filter = filter;
    this.position = after;
    this.checksum = Buffer.alloc(0);
    this.caughtUp = false;
    this.reconnects = 0;
    this.closed = false;
    this._client = client;
    this._follow = follow;
    this._heartbeatMs = heartbeatMs;
    this._call = null;
    this._wake = null;
    this._iterator = null;
    this._forget = null;
  }

  [Symbol.asyncIterator](): AsyncIterator<FollowedChange> {
    this._iterator ??= this._iterate();
    return this._iterator;
  }

  private async *_iterate(): AsyncGenerator<FollowedChange, void, undefined> {
    try {
      yield* this._run();
    } finally {
      this.closed = true;
      this._forget?.();
    }
  }

  /** Stop the stream; a pending iteration ends (done) without an error. */
  close(): void {
    this.closed = true;
    this._call?.cancel();
    this._wake?.();
  }

  private _request(): Input<proto.FollowSessionsRequest> {
    const request: Input<proto.FollowSessionsRequest> = {
      prefix: this.prefix,
      filter: this.filter,
      after_position: this.position ?? 0,
      from_start: this.position === 0,
    };
    if (this._heartbeatMs) request.heartbeat_interval = duration(this._heartbeatMs);
    if (this.position && this.checksum.length) request.after_checksum = this.checksum;
    return request;
  }

  private async *_run(): AsyncGenerator<FollowedChange, void, undefined> {
    const client = this._client;
    const backoff = new Backoff(client.retry);
    let hops = 0;
    while (!this.closed) {
      const member = await client._pick();
      if (!member) {
        const wait = backoff.next();
        if (wait === null) throw client._nobody();
        await this._pause(wait);
        continue;
      }
      const options: RpcOptions = client.waitForReadyCalls ? { waitForReady: true } : {};
      const call = streamRpc(member.stub, "FollowSessions")(this._request(), client._metadata(false), options);
      this._call = call;
      const silenceMs = this._heartbeatMs * DEAD_AFTER_HEARTBEATS;
      let dead = false;
      let watchdog: NodeJS.Timeout | undefined;
      const arm = () => {
        if (!silenceMs) return;
        watchdog = setTimeout(() => {
          dead = true;
          call.cancel();
        }, silenceMs);
      };
      let delay: number | null = null;
      try {
        arm();
        for await (const response of call as AsyncIterable<proto.FollowSessionsResponse>) {
          clearTimeout(watchdog);
          backoff.reset();
          hops = 0;
          member.reached = true;
          for (const raw of response.changes ?? []) {
            const change: FollowedChange = {
              sessionId: raw.session_id,
              position: Number(raw.position ?? 0),
              events: (raw.events ?? []).map(fromEvent),
              deleted: Boolean(raw.deleted),
            };
            this.position = change.position;
            this.checksum = checksumAt(response, change.position);
            yield change;
          }
          const position = Number(response.position ?? 0);
          if (position) {
            this.position = Math.max(this.position ?? 0, position);
            this.checksum = checksumAt(response, this.position);
          }
          if (response.caught_up) {
            this.caughtUp = true;
            if (!this._follow) return;
          }
          arm();
        }
        return;
      } catch (error) {
        if (this.closed) return;
        let step = LATER;
        if (dead) client._moved(member);
        else step = client._after(member, error, true, hops, false, "", true);
        hops += step === AGAIN ? 1 : 0;
        delay = step === AGAIN ? 0 : step === LATER ? backoff.next() : null;
        if (delay === null && dead) throw deadStream(silenceMs, error);
        if (delay === null) throw toError(error);
      } finally {
        clearTimeout(watchdog);
        call.cancel();
        this._call = null;
      }
      await this._pause(delay as number);
      if (this.closed) return;
      this.reconnects += 1;
    }
  }

  private async _pause(delay: number): Promise<void> {
    await new Promise<void>((done) => {
      const timer = setTimeout(done, delay);
      this._wake = () => {
        clearTimeout(timer);
        done();
      };
    });
    this._wake = null;
  }
}

/** An EventStream over the owner group's client, moving on after WRONG_GROUP (see shard routing). */
class ShardedStream extends EventStream {
  private readonly _shards: Shards;

  constructor(shards: Shards, sessionId: string, seq: number, follow: boolean, timeoutMs: number | undefined, heartbeatMs = 0) {
    super(null, sessionId, seq, follow, timeoutMs, heartbeatMs);
    this._shards = shards;
  }

  override async *_run(): AsyncGenerator<Event[], void, undefined> {
    this._client = await this._shards.clientFor(this.sessionId);
    let reroutedAt: number | null = null;
    for (;;) {
      try {
        yield* super._run();
        return;
      } catch (error) {
        if (!(error instanceof SessionLogError) || error.reason !== WRONG_GROUP || reroutedAt === this.nextSeq) throw error;
        const owner = await this._shards.afterWrongGroup(this.sessionId, error, this._client);
        if (!owner) throw error;
        reroutedAt = this.nextSeq;
        this._client = owner;
      }
    }
  }
}

/**
 * A sessionlog client. Every method returns plain objects; failures reject with SessionLogError
 * (reason and metadata from the server's ErrorInfo). target: one address (a string, any gRPC
 * target), or the addresses of a group's members (an array, any order); or none, with the
 * options cluster ("etcd://HOST:PORT[,...]") and group, to find the leader in etcd. See routing.
 */
export class SessionLogClient {
  /** What errors name: the address(es), or the etcd group. */
  readonly target: string;
  readonly timeoutMs: number;
  /** @internal */
  readonly waitForReadyCalls: boolean;
  /** @internal */
  readonly connectTimeoutMs: number;
  /** @internal */
  readonly retry: RetryOptions;
  /** @internal */
  readonly replicasRetries: number;
  private readonly _etcd: string[];
  private readonly _group: string;
  private readonly _several: boolean;
  private readonly _alwaysReached: boolean;
  private readonly _retryWrongGroup: boolean;
  private readonly _epochs: Map<string, number>;
  private readonly _slotGroups: Map<number, string>;
  private readonly _token: string | undefined;
  private readonly _streams: Set<EventStream | SessionsStream | AppendStream>;
  private readonly _openAdmin: (member: Member) => ServiceClient;
  private readonly _openStub: (address: string) => ServiceClient;
  private readonly _members: Member[];
  private _current: number;
  private _stale: boolean;
  private _etcdError: string;
  private readonly _shards: Shards | null;

  constructor(target?: string | string[] | null, options: ClientOptions = {}) {
    const {
      timeoutMs = DEFAULT_TIMEOUT_MS,
      token,
      tls = false,
      rootCerts,
      privateKey,
      certChain,
      maxMessageBytes = DEFAULT_MAX_MESSAGE_BYTES,
      retry = {},
      protoDir = process.env.SESSIONLOG_PROTO_DIR ?? DEFAULT_PROTO_DIR,
      channelOptions = {},
      connectTimeoutMs = DEFAULT_CONNECT_TIMEOUT_MS,
      waitForReady = false,
      cluster,
      group,
      shardMap,
    } = options as ClientOptions & { [GROUP_CLIENT]?: boolean };
    if ((cluster === undefined) !== (group === undefined)) {
      throw new TypeError("give cluster and group together (etcd://HOST:PORT and the group name)");
    }
    this._etcd = cluster === undefined ? [] : parseCluster(cluster);
    if (group !== undefined) leaderKey(group); // refuse a bad name now, not at the first call
    this._group = group ?? "";
    let addresses: string[];
    let several: boolean;
    if (target === undefined || target === null) {
      addresses = this._etcd.length ? [] : [DEFAULT_TARGET];
      several = this._etcd.length > 0;
    } else if (typeof target === "string") {
      addresses = [checkAddress(target)];
      several = this._etcd.length > 0;
    } else {
      addresses = [...new Set(Array.from(target, (a) => String(a).trim()).filter(Boolean))];
      several = true;
      if (!addresses.length && !this._etcd.length) throw new TypeError("target lists no address");
      addresses.forEach(checkAddress);
    }
    this._several = several;
    this.waitForReadyCalls = waitForReady;
    this.connectTimeoutMs = connectTimeoutMs;
    this._alwaysReached = waitForReady;
    this.timeoutMs = timeoutMs;
    this.retry = retry;
    this.replicasRetries = retry.replicasRetries ?? DEFAULT_REPLICAS_RETRIES;
    /** Wait and try WRONG_GROUP again (a proxy catching up with a move); off for the group
     * clients of a shardMap client, whose shard routing reroutes it. */
    this._retryWrongGroup = shardMap === undefined && !(options as { [GROUP_CLIENT]?: boolean })[GROUP_CLIENT];
    /** The highest leadership epoch any member named, per group ("": not sharded; see routing). */
    this._epochs = new Map();
    /** The group each slot's writes last answered from (sharded servers only). */
    this._slotGroups = new Map();
    this._token = token;
    this._streams = new Set();
    const secure = tls || rootCerts || privateKey || certChain;
    const credentials = secure
      ? grpc.credentials.createSsl(
          (rootCerts ?? null) as Buffer | null,
          (privateKey ?? null) as Buffer | null,
          (certChain ?? null) as Buffer | null,
        )
      : grpc.credentials.createInsecure();
    const { log: Service, admin: AdminService } = loadServices(protoDir);
    /** A member's AdminService client, on its SessionLogService client's channel. */
    this._openAdmin = (member: Member) =>
      new AdminService(member.address, credentials, { channelOverride: member.stub.getChannel() });
    this._openStub = (address: string) =>
      new Service(address, credentials, {
        "grpc.max_receive_message_length": maxMessageBytes,
        "grpc.max_send_message_length": maxMessageBytes,
        "grpc.initial_reconnect_backoff_ms": 100,
        "grpc.max_reconnect_backoff_ms": 1000,
        ...KEEPALIVE_OPTIONS,
        ...channelOptions,
      });
    /** Every member known: { address, stub, reached, failed }; calls go to _members[_current]. */
    this._members = [];
    this._current = 0;
    this._stale = this._etcd.length > 0;
    this._etcdError = "";
    for (const address of addresses) this._member(address);
    const names = addresses.join(", ");
    this.target = this._etcd.length
      ? `group ${JSON.stringify(this._group)} in etcd at ${this._etcd.join(",")}${names ? ` (${names})` : ""}`
      : names;
    const groupOptions = { ...options, shardMap: undefined, cluster: undefined, group: undefined, [GROUP_CLIENT]: true };
    this._shards =
      shardMap === undefined ? null : new Shards(this, shardMap, (members) => new SessionLogClient(members, groupOptions));
  }

  /** The shard map calls are routed by (option shardMap), loaded if not yet; null without one. */
  async shardMap(): Promise<ShardTable | null> {
    return this._shards ? await this._shards.load() : null;
  }

  /** The highest leadership epoch any member named, of any group (see routing). */
  get epoch(): number {
    return Math.max(0, ...this._epochs.values());
  }

  /** Every address this client knows, given or learnt from hints and etcd. */
  get members(): string[] {
    return this._members.map((m) => m.address);
  }

  /** The address calls go to now (the primary as far as the client knows), or null. */
  get current(): string | null {
    return this._members[this._current]?.address ?? null;
  }

  /** The stub of the current member (the only one, given one address). */
  /** @internal */
  get _stub(): ServiceClient | undefined {
    return this._members[this._current]?.stub;
  }

  /** Close every open stream (they end as done; an AppendStream is cancelled: what it has
   * unanswered rejects with CANCELLED), then every channel. */
  close(): void {
    for (const stream of this._streams) {
      if (stream instanceof AppendStream) stream.cancel();
      else stream.close();
    }
    this._streams.clear();
    this._shards?.close();
    for (const member of this._members) member.stub.close();
  }

  /** Resolve once connected to the current member, or reject after timeoutMs. */
  async waitForReady(timeoutMs: number = this.timeoutMs): Promise<void> {
    const member = await this._pick();
    if (!member) throw this._nobody();
    return new Promise<void>((done, fail) => {
      member.stub.waitForReady(Date.now() + timeoutMs, (error) => (error ? fail(error) : done()));
    });
  }

  // -- routing (see the comment above parseCluster) -------------------------------------------

  /** The member of address, opened and added when new. */
  private _member(address: string): Member {
    let member = this._members.find((m) => m.address === address);
    if (!member) {
      member = { address, stub: this._openStub(address), reached: this._alwaysReached, failed: false, epoch: 0 };
      this._members.push(member);
    }
    return member;
  }

  /** The current member, reading etcd first when due (after a loss, or while none is known). */
  /** @internal */
  async _pick(): Promise<Member | null> {
    if (this._stale || (this._etcd.length && !this._members.length)) {
      this._stale = false;
      let leader: string | null = null;
      try {
        leader = await readLeader(this._etcd, this._group, { timeoutMs: this.connectTimeoutMs });
        this._etcdError = leader ? "" : `group ${JSON.stringify(this._group)} has no leader in etcd`;
      } catch (error) {
        this._etcdError = (error as Error).message;
      }
      if (leader) this._current = this._members.indexOf(this._member(leader));
    }
    return this._members[this._current] ?? null;
  }

  /** What a call rejects with when no member was ever known (etcd had no leader to name). */
  /** @internal */
  _nobody(): SessionLogError {
    const why = this._etcdError || "no address is known";
    return new SessionLogError(`no sessionlog primary found for ${this.target}: ${why}`, {
      code: grpc.status.UNAVAILABLE,
      reason: "UNAVAILABLE",
    });
  }

  /** member failed as the current one: the next address becomes current; etcd is read next. */
  /** @internal */
  _moved(member: Member): void {
    if (this._members[this._current] === member) this._current = (this._current + 1) % this._members.length;
    this._stale = this._etcd.length > 0;
  }

  /** Record what error says about member and decide what the failed call does: AGAIN, LATER or
   * RAISE (or throw at once when no address has ever answered). deadlineMoves: a unary call that
   * retries, for which a deadline is no answer. */
  /** @internal */
  _after(member: Member, thrown: unknown, retry: boolean, hops: number, deadlineMoves = false, sessionId = "", stream = false): Step {
    const error = thrown as Failure;
    const info = errorInfo(error);
    if (info) member.reached = true;
    const group = trailingGroup(error?.metadata);
    const current = this._learn(member, trailingEpoch(error?.metadata), group, sessionId);
    // A proxy's 502/503/504 is an answer (no primary right now), not an unreachable address;
    // a read stream (stream) resumes after any end of the transport, and a unary call that
    // retries (deadlineMoves: a read, or a write whose request id makes a second try harmless)
    // is sent again after one (a server stopping with the call in flight: CANCELLED).
    const proxied = proxyStatus(error) !== null;
    const unavailable: boolean =
      error?.code === grpc.status.UNAVAILABLE || proxied || ((stream || deadlineMoves) && transportEnd(error));
    const answered = member.reached || proxied;
    if (info?.reason === "REPLICAS_UNAVAILABLE") return retry ? LATER : RAISE; // committed here
    if (info?.reason === "SLOT_MOVING") return LATER; // written nowhere: wait for the flip, here
    if (info?.reason === WRONG_GROUP) return this._retryWrongGroup ? LATER : RAISE;
    if (!this._several) {
      if (error?.settle) throw error;
      if (unavailable && !info && !answered) throw unreachable([member], error);
      return retry && unavailable ? LATER : RAISE;
    }
    if (info?.reason === "NOT_PRIMARY") {
      // The primary it named now, and a deposed member's (a lower epoch) next one now too, as
      // for an address never reached; otherwise the next one later.
      if (this._notPrimary(member, info.metadata ?? {}, group, current) === "next") return LATER;
      return hops < 2 * this._members.length + 2 ? AGAIN : LATER;
    }
    if (error?.code === grpc.status.DEADLINE_EXCEEDED && deadlineMoves && !info) {
      this._moved(member);
      return LATER;
    }
    if (!unavailable) return RAISE;
    if (!info && !answered) {
      member.failed = true;
      this._moved(member);
      const untried = this._members.filter((m) => !m.reached);
      if (untried.length === this._members.length && untried.every((m) => m.failed)) throw unreachable(untried, error);
      return hops < 2 * this._members.length + 2 ? AGAIN : LATER;
    }
    this._moved(member);
    return retry ? LATER : RAISE;
  }

  /**
   * A NOT_PRIMARY member answered (a unary call's, or one inside an AppendStream): the next call
   * goes to the primary it names ("primary"), else to the next member: "deposed" when member's
   * epoch is below one seen (or current is false: its reply's was), "next" otherwise. One
   * address: nothing moves.
   */
  /** @internal */
  _notPrimary(member: Member, metadata: Record<string, string>, group = "", current = true): "primary" | "deposed" | "next" {
    if (!this._several) return "next";
    const live = this._learn(member, whole(metadata.epoch), group) && current;
    const hint = metadata[PRIMARY_HINT] ?? "";
    if (live && hint && hint !== member.address) {
      this._current = this._members.indexOf(this._member(hint));
      return "primary";
    }
    this._moved(member);
    return live ? "next" : "deposed";
  }

  /**
   * Before a member first answers: wait until its channel connects or fails, at most
   * connectTimeoutMs (a call whose own deadline is shorter needs no such wait).
   */
  /** @internal */
  async _settle(member: Member, timeoutMs: number): Promise<void> {
    if (member.reached || timeoutMs <= this.connectTimeoutMs) return;
    const channel = member.stub.getChannel();
    const { READY, TRANSIENT_FAILURE, SHUTDOWN } = grpc.connectivityState;
    const deadline = Date.now() + this.connectTimeoutMs;
    let state = channel.getConnectivityState(true);
    while (state !== READY && state !== TRANSIENT_FAILURE && state !== SHUTDOWN) {
      const changed = await new Promise<boolean>((done) => channel.watchConnectivityState(state, deadline, (error) => done(!error)));
      if (!changed) {
        const error = new SessionLogError(
          `no connection to a sessionlog server at ${member.address} within ${this.connectTimeoutMs / 1000} s: is the address right, and is the server up?`,
          { code: grpc.status.UNAVAILABLE, reason: "UNAVAILABLE" },
        );
        error.settle = true;
        throw error;
      }
      state = channel.getConnectivityState(true);
    }
  }

  /** The group whose epoch a write for sessionId carries ("": none named, or not sharded). */
  private _groupOf(sessionId: string): string {
    if (!this._slotGroups.size || !sessionId) return "";
    return this._slotGroups.get(slotOf(sessionId)) ?? "";
  }

  /** member of group named epoch (0: none) in a reply for sessionId; false when that is below
   * the group's highest epoch seen before: it was deposed. */
  private _learn(member: Member, epoch: number, group = "", sessionId = ""): boolean {
    if (group && sessionId) this._slotGroups.set(slotOf(sessionId), group);
    if (!epoch) return true;
    member.epoch = epoch;
    const seen = this._epochs.get(group) ?? 0;
    this._epochs.set(group, Math.max(seen, epoch));
    return epoch >= seen;
  }

  /** A write member acknowledged (its reply's trailers, or an AppendStream's headers) for
   * sessionId: LeadershipLostError when its epoch is below the highest seen of its group (a
   * deposed server took it: it is not the group's). */
  /** @internal */
  _accepted(member: Member, trailers: grpc.Metadata | undefined, sessionId = ""): void {
    const epoch = trailingEpoch(trailers);
    const group = trailingGroup(trailers);
    if (this._learn(member, epoch, group, sessionId)) return;
    this._moved(member);
    throw new LeadershipLostError(
      `${member.address} took the write at epoch ${epoch}, but this client has seen epoch ${this._epochs.get(group) ?? 0}: ` +
        "that server was deposed, and what it stored is on a history the group discards when it rejoins. " +
        "The write is not acknowledged; send it again (with the same requestId) to the current primary",
      { code: grpc.status.UNAVAILABLE, metadata: { committed: "True" } },
    );
  }

  /** @internal */
  _metadata(write = false, sessionId = ""): grpc.Metadata {
    const metadata = new grpc.Metadata();
    if (this._token) metadata.add("authorization", `Bearer ${this._token}`);
    if (sessionId) metadata.add(SESSION_HEADER, sessionHeader(sessionId));
    if (write) this._addEpoch(metadata, this._groupOf(sessionId));
    return metadata;
  }

  /**
   * An AppendStream's request metadata: the token, and the epoch of the group that answers for
   * its first append's session (of the one group known, when this client has only seen one),
   * so a server below it refuses each append; no x-session-id: the stream names no session.
   */
  /** @internal */
  _streamMetadata(sessionId: string): grpc.Metadata {
    const metadata = this._metadata(false);
    let group = this._groupOf(sessionId);
    if (!group && !this._epochs.has("") && this._epochs.size === 1) [group] = this._epochs.keys();
    this._addEpoch(metadata, group);
    return metadata;
  }

  /** An AppendStream's headers from member: the epoch and group they name (learnt). */
  /** @internal */
  _opened(member: Member, headers: grpc.Metadata): { epoch: number; group: string } {
    const epoch = trailingEpoch(headers);
    const group = trailingGroup(headers);
    this._learn(member, epoch, group);
    return { epoch, group };
  }

  /** The highest epoch seen of group (0: none). */
  /** @internal */
  _seen(group: string): number {
    return this._epochs.get(group) ?? 0;
  }

  /** A write's epoch metadata: the highest seen of group, with group's name (nothing while none). */
  private _addEpoch(metadata: grpc.Metadata, group: string): void {
    const epoch = this._epochs.get(group) ?? 0;
    if (!epoch) return;
    metadata.add(EPOCH_KEY, String(epoch));
    if (group) metadata.add(EPOCH_GROUP_KEY, group);
  }

  /** One unary call: { reply, trailers } once its status has arrived. */
  private _once<M extends UnaryMethod>(
    member: Member,
    method: M,
    request: Input<Methods[M]["request"]>,
    timeoutMs: number | undefined,
    write = false,
    admin = false,
  ): Promise<{ reply: Methods[M]["response"]; trailers: grpc.Metadata }> {
    const options: RpcOptions = { deadline: Date.now() + (timeoutMs ?? this.timeoutMs) };
    if (this.waitForReadyCalls) options.waitForReady = true;
    const stub = admin ? (member.admin ??= this._openAdmin(member)) : member.stub;
    const rpc = (stub as unknown as Record<string, UnaryRpc>)[method];
    return new Promise((done, fail) => {
      let reply: Methods[M]["response"];
      const call = rpc.call(stub, request, this._metadata(write, sessionOf(request)), options, (error, value) => {
        if (error) fail(error);
        else reply = value as Methods[M]["response"];
      });
      call.on("status", (status: grpc.StatusObject) => {
        if (status.code === grpc.status.OK) done({ reply, trailers: status.metadata });
      });
    });
  }

  /** One RPC: to the session's owner group with shardMap, else through this client's routing. */
  /** @internal */
  async _call<M extends UnaryMethod>(
    method: M,
    request: Input<Methods[M]["request"]>,
    options: SendOptions = {},
  ): Promise<Methods[M]["response"]> {
    const session = this._shards ? sessionOf(request) : "";
    if (!session || !this._shards) return this._send(method, request, options);
    const owner = await this._shards.clientFor(session);
    if (owner === this) return this._send(method, request, options);
    try {
      return await owner._call(method, request, options);
    } catch (error) {
      if (!(error instanceof SessionLogError) || error.reason !== WRONG_GROUP) throw error;
      // Refused before anything was done (ownership is checked first): safe to send again.
      const again = await this._shards.afterWrongGroup(session, error, owner);
      if (!again) throw error;
      return again._call(method, request, options);
    }
  }

  private async _send<M extends UnaryMethod>(
    method: M,
    request: Input<Methods[M]["request"]>,
    { timeoutMs, retry = false, write = false, admin = false }: SendOptions = {},
  ): Promise<Methods[M]["response"]> {
    const backoff = new Backoff(this.retry);
    let hops = 0;
    let waits = 0;
    for (;;) {
      const member = await this._pick();
      if (!member) {
        // No primary known yet (etcd named none): wait and ask again.
        const delay = backoff.next();
        if (delay === null) throw this._nobody();
        await sleep(delay);
        continue;
      }
      let step: Step;
      let failure: unknown;
      try {
        await this._settle(member, timeoutMs ?? this.timeoutMs);
        const { reply, trailers } = await this._once(member, method, request, timeoutMs, write, admin);
        member.reached = true;
        if (write) this._accepted(member, trailers, sessionOf(request));
        return reply;
      } catch (error) {
        failure = error;
        if (error instanceof LeadershipLostError) {
          step = retry ? LATER : RAISE; // acknowledged by a deposed member: not an acknowledgement
        } else {
          step = this._after(member, error, retry, hops, retry, sessionOf(request));
        }
      }
      if (step === AGAIN) {
        hops += 1;
        continue;
      }
      if (errorInfo(failure)?.reason === "REPLICAS_UNAVAILABLE" && ++waits > this.replicasRetries) step = RAISE;
      const delay = step === LATER ? backoff.next(moveBudget(failure, this.retry)) : null;
      if (delay === null) throw toError(failure);
      await sleep(delay);
    }
  }

  /**
   * Append events atomically. Retried on UNAVAILABLE with one requestId (a fresh one unless
   * given; "" turns both off), so a retry never writes twice.
   */
  async append(sessionId: string, events: NewEvent[], options: AppendOptions = {}): Promise<AppendResult> {
    const request = appendRequest(sessionId, events, { ...options, requestId: options.requestId ?? randomUUID() });
    const reply = await this._call("Append", request, { timeoutMs: options.timeoutMs, retry: request.request_id !== "", write: true });
    return appendResult(reply);
  }

  /**
   * A stream that pipelines appends over one AppendStream call: `append()` sends at once and
   * resolves with what client.append would, without waiting for the appends before it. See
   * AppendStream; `await stream.close()` when done.
   */
  appendStream(options: AppendStreamOptions = {}): AppendStream {
    if (this._shards) {
      throw new TypeError(
        "appendStream() is not routed by a shard map: open one on each group's own client " +
          "(new SessionLogClient(group.members)) and send each session's appends to its owner's",
      );
    }
    const stream = new AppendStream(this, options);
    this._streams.add(stream);
    stream._forget = () => this._streams.delete(stream);
    return stream;
  }

  /** The stored events from seq on, then done. `for await (const e of client.since(id))`. */
  since(sessionId: string, { seq = 0, timeoutMs }: { seq?: number; timeoutMs?: number } = {}): EventStream {
    return this._open(this._stream(sessionId, checkSeq(seq, "seq"), false, timeoutMs));
  }

  /**
   * Stored events from seq on, then live ones as they commit, until close() or break. The server
   * is asked for a heartbeat every heartbeatMs while the session is idle; three silent intervals
   * mean a dead stream, resumed from nextSeq. heartbeatMs 0: the server's interval, no deadline.
   */
  follow(sessionId: string, { seq = 0, heartbeatMs = DEFAULT_FOLLOW_HEARTBEAT_MS }: { seq?: number; heartbeatMs?: number } = {}): EventStream {
    return this._open(this._stream(sessionId, checkSeq(seq, "seq"), true, undefined, heartbeatMs));
  }

  /**
   * The events of every session under prefix (and matching the ListSessions filter), change by
   * change in commit order, resumable by change-feed position. after: null (the default) starts
   * with what commits from the stream's first iteration on, 0 replays the whole feed first, N resumes after position N
   * (a change's position, or the stream's position, which heartbeats advance too). follow false
   * stops once the changes stored at the start were delivered. A token limited to a session
   * prefix follows its own sessions only; a sharded server streams its own group's sessions.
   */
  followSessions({
    prefix = "",
    filter = "",
    after = null,
    follow = true,
    heartbeatMs = DEFAULT_FOLLOW_HEARTBEAT_MS,
  }: { prefix?: string; filter?: string; after?: number | null; follow?: boolean; heartbeatMs?: number } = {}): SessionsStream {
    return this._open(new SessionsStream(this, { prefix, filter, after, follow, heartbeatMs }));
  }

  private _stream(sessionId: string, seq: number, follow: boolean, timeoutMs: number | undefined, heartbeatMs = 0): EventStream {
    return this._shards
      ? new ShardedStream(this._shards, sessionId, seq, follow, timeoutMs, heartbeatMs)
      : new EventStream(this, sessionId, seq, follow, timeoutMs, heartbeatMs);
  }

  private _open<S extends EventStream | SessionsStream>(stream: S): S {
    this._streams.add(stream);
    stream._forget = () => this._streams.delete(stream);
    return stream;
  }

  async surface(sessionId: string, { atSeq, timeoutMs }: { atSeq?: number } & CallOptions = {}): Promise<SurfaceResult> {
    const request: Input<proto.SurfaceRequest> = { session_id: sessionId };
    if (atSeq !== undefined) request.at_seq = checkSeq(atSeq, "atSeq");
    const reply = await this._call("Surface", request, { timeoutMs, retry: true });
    return {
      events: (reply.events ?? []).map(fromEvent),
      eventCount: Number(reply.event_count ?? 0),
      replaceGeneration: Number(reply.replace_generation ?? 0),
    };
  }

  /**
   * The session's token usage totals per model (the usage ledger), over the whole log or events
   * 0..atSeq. ownUsage leaves out what a fork copied from its parent; includeDescendants adds
   * the own usage of every fork taken of the session (and of those), counting copies once.
   */
  async getUsage(
    sessionId: string,
    { atSeq, includeDescendants = false, timeoutMs }: { atSeq?: number; includeDescendants?: boolean } & CallOptions = {},
  ): Promise<UsageReport> {
    const request: Input<proto.GetUsageRequest> = { session_id: sessionId, include_descendants: includeDescendants };
    if (atSeq !== undefined) request.at_seq = checkSeq(atSeq, "atSeq");
    const reply = await this._call("GetUsage", request, { timeoutMs, retry: true });
    return {
      usage: fromModelUsages(reply.usage),
      eventCount: Number(reply.event_count ?? 0),
      ownUsage: fromModelUsages(reply.own_usage),
      descendantSessionIds: reply.descendant_session_ids ?? [],
    };
  }

  /**
   * The session's state: every event's state_delta folded in seq order (each key replaces the
   * one before; null deletes it), after the whole log or, with atSeq, after events 0..atSeq.
   * eventCount is the number of events folded. A session never written has the state {}.
   */
  async getState(sessionId: string, { atSeq, timeoutMs }: { atSeq?: number } & CallOptions = {}): Promise<StateResult> {
    const request: Input<proto.GetStateRequest> = { session_id: sessionId };
    if (atSeq !== undefined) request.at_seq = checkSeq(atSeq, "atSeq");
    const reply = await this._call("GetState", request, { timeoutMs, retry: true });
    return { state: fromStruct(reply.state), eventCount: Number(reply.event_count ?? 0) };
  }

  /**
   * The derived messages in the OpenAI chat format, with the seq each came from. With pageSize
   * (at most 1000), only the last pageSize messages and a nextPageToken to pass as pageToken for
   * the ones before them; the view stays as the first page saw it, and the server reads the log
   * backwards, not all of it.
   */
  async deriveMessages(
    sessionId: string,
    {
      atSeq,
      extra = false,
      pageSize = 0,
      pageToken = "",
      timeoutMs,
    }: { atSeq?: number; extra?: boolean; pageSize?: number; pageToken?: string } & CallOptions = {},
  ): Promise<DerivedMessages> {
    const request: Input<proto.DeriveMessagesRequest> = { session_id: sessionId, page_size: checkPageSize(pageSize), page_token: pageToken };
    if (atSeq !== undefined) request.at_seq = checkSeq(atSeq, "atSeq");
    const reply = await this._call("DeriveMessages", request, { timeoutMs, retry: true });
    return {
      messages: (reply.messages ?? []).map((m) => fromMessage(m, { extra })),
      seqs: (reply.seqs ?? []).map(Number),
      eventCount: Number(reply.event_count ?? 0),
      replaceGeneration: Number(reply.replace_generation ?? 0),
      nextPageToken: reply.next_page_token ?? "",
    };
  }

  /**
   * The last n derived messages (fewer when the view has fewer), in order, with their seqs;
   * nextPageToken continues before them. Costs the events from the end back to the first of
   * them, whatever the log's length.
   */
  async lastMessages(
    sessionId: string,
    n: number,
    { atSeq, extra = false, timeoutMs }: { atSeq?: number; extra?: boolean } & CallOptions = {},
  ): Promise<DerivedMessages> {
    checkCount(n);
    const held = await this.deriveMessages(sessionId, { atSeq, extra, pageSize: Math.max(1, Math.min(n, MAX_PAGE_SIZE)), timeoutMs });
    if (n === 0) Object.assign(held, { messages: [], seqs: [], nextPageToken: "" });
    while (held.messages.length < n && held.nextPageToken) {
      const pageSize = Math.min(n - held.messages.length, MAX_PAGE_SIZE);
      const older = await this.deriveMessages(sessionId, { atSeq, extra, pageSize, pageToken: held.nextPageToken, timeoutMs });
      held.messages = [...older.messages, ...held.messages];
      held.seqs = [...older.seqs, ...held.seqs];
      held.nextPageToken = older.nextPageToken;
    }
    return held;
  }

  /**
   * One page of stored events: oldest first (orderBy "seq") or newest first ("seq desc"),
   * pageSize of them (0: 100; at most 1000). Pass nextPageToken as pageToken for the next page;
   * newest first stays pinned to the log as the first page saw it.
   */
  async listEvents(
    sessionId: string,
    {
      pageSize = 0,
      pageToken = "",
      orderBy = "seq",
      timeoutMs,
    }: { pageSize?: number; pageToken?: string; orderBy?: "seq" | "seq asc" | "seq desc" } & CallOptions = {},
  ): Promise<EventPage> {
    const request = { session_id: sessionId, page_size: checkPageSize(pageSize), page_token: pageToken, order_by: orderBy };
    const reply = await this._call("ListEvents", request, { timeoutMs, retry: true });
    return {
      events: (reply.events ?? []).map(fromEvent),
      nextPageToken: reply.next_page_token ?? "",
      eventCount: Number(reply.event_count ?? 0),
      sessionUid: reply.session_uid ?? "",
    };
  }

  /** The last n stored events (fewer when the log is shorter), in seq order: n reads, not the log. */
  async lastEvents(sessionId: string, n: number, { timeoutMs }: CallOptions = {}): Promise<Event[]> {
    checkCount(n);
    const newest: Event[] = [];
    let pageToken = "";
    while (newest.length < n) {
      const pageSize = Math.min(n - newest.length, MAX_PAGE_SIZE);
      const page = await this.listEvents(sessionId, { pageSize, pageToken, orderBy: "seq desc", timeoutMs });
      newest.push(...page.events);
      pageToken = page.nextPageToken;
      if (!pageToken) break;
    }
    return newest.reverse();
  }

  /**
   * Hide the surface positions [startSeq, stopSeq] (inclusive) from the view, adding no message:
   * one EVENT_TYPE_HIDE event, kept in the log. Only events appended before it are hidden.
   */
  async hide(
    sessionId: string,
    startSeq: number,
    stopSeq: number,
    { reason, expectedSeq, expectedUid, timeoutMs }: { reason?: string; expectedSeq?: number; expectedUid?: string } & CallOptions = {},
  ): Promise<AppendResult> {
    const data: JsonObject = reason === undefined || reason === null ? {} : { reason };
    return this.append(sessionId, [{ type: "hide", data, replace: [startSeq, stopSeq] }], { expectedSeq, expectedUid, timeoutMs });
  }

  /**
   * Hide the newest message of the view and return { seq, message }; undefined when the view is
   * empty. The hide carries expectedSeq (the length read), so a concurrent write makes it re-read
   * instead of hiding the wrong message or a second one.
   */
  async popLast(
    sessionId: string,
    { reason = "pop_last", extra = false, timeoutMs }: { reason?: string; extra?: boolean } & CallOptions = {},
  ): Promise<{ seq: number; message: ChatMessage } | undefined> {
    for (;;) {
      const shown = await this.surface(sessionId, { timeoutMs });
      const last = shown.events.at(-1);
      if (last === undefined) return undefined;
      const where = last.replace ? last.replace[0] : last.seq;
      const derived = await this.deriveMessages(sessionId, { atSeq: shown.eventCount - 1, extra, timeoutMs });
      try {
        await this.hide(sessionId, where, where, { reason, expectedSeq: shown.eventCount, timeoutMs });
      } catch (error) {
        if (error instanceof SessionLogError && error.reason === "SEQ_CONFLICT") continue;
        throw error;
      }
      return { seq: last.seq, message: derived.messages.at(-1) as ChatMessage };
    }
  }

  /** Hide every message so far (one hide over [0, last seq]); undefined, writing nothing, for an
   * empty session. A concurrent append makes it re-read the length. */
  async clear(sessionId: string, { reason = "clear", timeoutMs }: { reason?: string } & CallOptions = {}): Promise<AppendResult | undefined> {
    for (;;) {
      const { eventCount } = await this.surface(sessionId, { timeoutMs });
      if (eventCount === 0) return undefined;
      try {
        return await this.hide(sessionId, 0, eventCount - 1, { reason, expectedSeq: eventCount, timeoutMs });
      } catch (error) {
        if (error instanceof SessionLogError && error.reason === "SEQ_CONFLICT") continue;
        throw error;
      }
    }
  }

  /**
   * Create a session. Retried on UNAVAILABLE with one requestId (a fresh one unless given; ""
   * for none and no retry): a retry after a lost reply gets the first result.
   */
  async createSession(
    sessionId: string,
    events: NewEvent[] = [],
    {
      leaseHolder = "",
      leaseToken = 0,
      requestId,
      timeoutMs,
      title = "",
      labels = {},
      owner = "",
      status = "",
      parentSessionId = "",
      parentSeq,
      ttlMs,
      expireTime,
      pinned = false,
    }: LifecycleOptions & SessionFields = {},
  ): Promise<{ session: Session; events: Event[] }> {
    const request_id = requestId ?? randomUUID();
    const request: Input<proto.CreateSessionRequest> = {
      session_id: sessionId,
      events: events.map(toEvent),
      lease_holder: leaseHolder,
      lease_token: leaseToken,
      request_id,
      title,
      labels,
      owner,
      status,
      parent_session_id: parentSessionId,
    };
    if (parentSeq !== undefined) request.parent_seq = checkSeq(parentSeq, "parentSeq");
    if (ttlMs !== undefined && expireTime !== undefined) {
      throw refused("ttlMs", "createSession: give ttlMs or expireTime, not both");
    }
    if (ttlMs !== undefined) request.ttl = duration(ttlMs);
    if (expireTime !== undefined) request.expire_time = toTimestamp(expireTime);
    request.pinned = pinned;
    const reply = await this._call("CreateSession", request, { timeoutMs, retry: request_id !== "", write: true });
    return { session: fromSession(reply.session), events: (reply.events ?? []).map(fromEvent) };
  }

  /** Create a session from chat messages; requestId and retries as for createSession. */
  async seedSession(
    sessionId: string,
    messages: ChatMessageInput[],
    { leaseHolder = "", leaseToken = 0, requestId, timeoutMs }: LifecycleOptions = {},
  ): Promise<{ session: Session; events: Event[]; drops: { index: number; reason: string }[] }> {
    const request_id = requestId ?? randomUUID();
    const request: Input<proto.SeedSessionRequest> = {
      session_id: sessionId,
      messages: messages.map(toMessage),
      lease_holder: leaseHolder,
      lease_token: leaseToken,
      request_id,
    };
    const reply = await this._call("SeedSession", request, { timeoutMs, retry: request_id !== "", write: true });
    return {
      session: fromSession(reply.session),
      events: (reply.events ?? []).map(fromEvent),
      drops: (reply.drops ?? []).map((d) => ({ index: d.index, reason: d.reason })),
    };
  }

  async getSession(sessionId: string, { timeoutMs }: CallOptions = {}): Promise<{ session: Session; leaseAudit: LeaseAuditEntry[] }> {
    const reply = await this._call("GetSession", { session_id: sessionId }, { timeoutMs, retry: true });
    return {
      session: fromSession(reply.session),
      leaseAudit: (reply.lease_audit ?? []).map(fromAuditEntry),
    };
  }

  /**
   * Every page of the lease audit of every session (or of those whose id starts with prefix):
   * takeovers and forced releases in session id order, each with its sessionId and its index
   * in that session's audit. AdminService: needs an admin token without a session prefix.
   * `for await (const page of client.listLeaseAudit({ prefix: "tenant-a." }))`.
   */
  async *listLeaseAudit({
    prefix = "",
    pageSize = 0,
    timeoutMs,
  }: { prefix?: string; pageSize?: number } & CallOptions = {}): AsyncGenerator<LeaseAuditPage, void, undefined> {
    let page_token = "";
    for (;;) {
      const request = { page_size: checkPageSize(pageSize), page_token, prefix };
      const reply = await this._call("ListLeaseAudit", request, { timeoutMs, retry: true, admin: true });
      const entries = (reply.entries ?? []).map((e) => ({
        sessionId: e.session_id,
        index: Number(e.index ?? 0),
        ...fromAuditEntry(e.entry ?? ({} as proto.LeaseAuditEntry)),
      }));
      yield { entries, nextPageToken: reply.next_page_token ?? "" };
      page_token = reply.next_page_token ?? "";
      if (!page_token) return;
    }
  }

  /**
   * Every page of sessions: `for await (const page of client.listSessions())`. `filter` is the
   * server's AIP-160 subset (`labels.team = "core" AND owner = "ana"`), `orderBy` is
   * "session_id" (default) or "update_time desc". `view` "full" puts each session's state
   * (as getState returns it) in `session.state`, in the same call. A page may hold fewer
   * sessions than pageSize (the server keeps each reply within its --max-message-size): only an
   * empty nextPageToken ends the listing, and the generator follows it. A page over this
   * client's own maxMessageBytes is asked for again with half the sessions.
   */
  async *listSessions({
    prefix = "",
    pageSize = 0,
    filter = "",
    orderBy = "",
    view = "basic",
    timeoutMs,
  }: {
    prefix?: string;
    pageSize?: number;
    filter?: string;
    orderBy?: string;
    view?: "basic" | "full";
  } & CallOptions = {}): AsyncGenerator<
    SessionPage,
    void,
    undefined
  > {
    let page_token = "";
    let size = checkPageSize(pageSize);
    for (;;) {
      const request = {
        page_size: size,
        page_token,
        prefix,
        filter,
        order_by: orderBy,
        view: (view === "full" ? "SESSION_VIEW_FULL" : "SESSION_VIEW_BASIC") as proto.SessionView,
      };
      let reply: proto.ListSessionsResponse;
      try {
        reply = await this._call("ListSessions", request, { timeoutMs, retry: true });
      } catch (error) {
        const smaller = (error as SessionLogError)?.reason === "RESPONSE_TOO_LARGE" ? smallerListingPage(size, view === "full") : null;
        if (smaller === null) throw error;
        size = smaller; // the same token: a page of fewer sessions
        continue;
      }
      yield {
        sessions: (reply.sessions ?? []).map(fromSession),
        nextPageToken: reply.next_page_token ?? "",
        usageTotal: fromModelUsages(reply.usage_total),
      };
      page_token = reply.next_page_token ?? "";
      if (!page_token) return;
    }
  }

  /**
   * Set a session's title, owner, status or labels: only the fields given change (the update
   * mask names exactly them). `labels` replaces the whole map; `setLabels` / `removeLabels`
   * change single keys. `ttlMs` expires the session that long from now, `expireTime` at a time
   * (null: never), `pinned` pins or unpins it (README "Retention"). Resolves to the session as
   * updated.
   */
  async updateSession(
    sessionId: string,
    {
      title,
      labels,
      owner,
      status,
      setLabels = {},
      removeLabels = [],
      ttlMs,
      expireTime,
      pinned,
      timeoutMs,
    }: {
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
    } & CallOptions = {},
  ): Promise<Session> {
    const session: Input<proto.Session> & { labels: Record<string, string> } = { session_id: sessionId, labels: {} };
    const paths: string[] = [];
    for (const [name, value] of [["title", title], ["owner", owner], ["status", status]] as const) {
      if (value !== undefined) {
        session[name] = value;
        paths.push(name);
      }
    }
    if (labels !== undefined) {
      Object.assign(session.labels, labels);
      paths.push("labels");
    }
    for (const [key, value] of Object.entries(setLabels)) {
      session.labels[key] = value;
      paths.push(`labels.${key}`);
    }
    for (const key of removeLabels) paths.push(`labels.${key}`);
    if (ttlMs !== undefined && expireTime !== undefined) {
      throw refused("ttlMs", "updateSession: give ttlMs or expireTime, not both");
    }
    if (ttlMs !== undefined) {
      session.ttl = duration(ttlMs);
      paths.push("ttl");
    }
    if (expireTime !== undefined) {
      if (expireTime !== null) session.expire_time = toTimestamp(expireTime);
      paths.push("expire_time");
    }
    if (pinned !== undefined) {
      session.pinned = Boolean(pinned);
      paths.push("pinned");
    }
    if (paths.length === 0) throw refused("fields", "updateSession: name at least one field to set");
    const request = { session, update_mask: { paths } };
    const reply = await this._call("UpdateSession", request, { timeoutMs, retry: true, write: true });
    return fromSession(reply.session);
  }

  /** The sub-agent children and forks of a session, in id order (every page). */
  async children(sessionId: string, { timeoutMs }: CallOptions = {}): Promise<Session[]> {
    const found: Session[] = [];
    const filter = `parent = ${JSON.stringify(sessionId)}`;
    for await (const page of this.listSessions({ filter, timeoutMs })) found.push(...page.sessions);
    return found;
  }

  /**
   * Fork a session; requestId and retries as for createSession. The server keeps the requestId
   * on the parent, so a retry returns the first child (the same generated id), never a second.
   */
  async forkSession(
    parentSessionId: string,
    {
      atSeq,
      sessionId = "",
      leaseHolder = "",
      leaseToken = 0,
      requestId,
      timeoutMs,
    }: { atSeq?: number; sessionId?: string } & LifecycleOptions = {},
  ): Promise<{ session: Session }> {
    const request_id = requestId ?? randomUUID();
    const request: Input<proto.ForkSessionRequest> = {
      parent_session_id: parentSessionId,
      session_id: sessionId,
      lease_holder: leaseHolder,
      lease_token: leaseToken,
      request_id,
    };
    if (atSeq !== undefined) request.at_seq = checkSeq(atSeq, "atSeq");
    const reply = await this._call("ForkSession", request, { timeoutMs, retry: request_id !== "", write: true });
    return { session: fromSession(reply.session) };
  }

  /**
   * Import one chunk of a session as it was elsewhere (ImportSession): events keep their seqs
   * (numbered from firstSeq when they carry none) and times; the chunk that creates the session
   * (firstSeq 0) sets its createTime and fork parent, later ones continue at its next seq. Not
   * retried: a chunk sent twice is refused (IMPORT_SEQ_MISMATCH, whose next_seq says where to
   * go on). Events read with since() go back in as they are.
   */
  async importSession(
    sessionId: string,
    events: (NewEvent & { seq?: number })[] = [],
    options: ImportOptions = {},
  ): Promise<{ session: Session; importedCount: number }> {
    const { firstSeq = 0, createTime, lastAppendTime, parentSessionId = "", parentEventCount = 0, timeoutMs } = options;
    const request: Input<proto.ImportSessionRequest> = {
      session_id: sessionId,
      first_seq: firstSeq,
      events: events.map((event, index) => ({ ...toEvent(event), seq: event.seq ?? firstSeq + index })),
      parent_session_id: parentSessionId,
      parent_event_count: parentEventCount,
    };
    if (createTime !== undefined) request.create_time = toTimestamp(createTime);
    if (lastAppendTime !== undefined) request.last_append_time = toTimestamp(lastAppendTime);
    const reply = await this._call("ImportSession", request, { timeoutMs, retry: false, write: true });
    return { session: fromSession(reply.session), importedCount: Number(reply.imported_count ?? 0) };
  }

  async acquireLease(sessionId: string, holder: string, { ttlMs, timeoutMs }: { ttlMs?: number } & CallOptions = {}): Promise<{ lease: Lease }> {
    const request = { session_id: sessionId, holder, ttl: duration(ttlMs) };
    const reply = await this._call("AcquireLease", request, { timeoutMs, retry: true, write: true });
    return { lease: fromLease(reply.lease) as Lease };
  }

  async renewLease(sessionId: string, holder: string, { ttlMs, timeoutMs }: { ttlMs?: number } & CallOptions = {}): Promise<{ lease: Lease }> {
    const request = { session_id: sessionId, holder, ttl: duration(ttlMs) };
    const reply = await this._call("RenewLease", request, { timeoutMs, retry: true, write: true });
    return { lease: fromLease(reply.lease) as Lease };
  }

  async releaseLease(
    sessionId: string,
    holder: string,
    { force = false, timeoutMs }: { force?: boolean } & CallOptions = {},
  ): Promise<{ released?: Lease }> {
    const reply = await this._call("ReleaseLease", { session_id: sessionId, holder, force }, { timeoutMs, write: true });
    return { released: fromLease(reply.released) };
  }

  /**
   * Erase a session for good (events, request records, lease and audit; replicas too). Fails
   * with SESSION_NOT_FOUND when it is not stored. Not retried: a retry after a lost reply would
   * find nothing.
   */
  async deleteSession(
    sessionId: string,
    {
      expectedSeq,
      leaseHolder = "",
      force = false,
      reason = "",
      timeoutMs,
    }: { expectedSeq?: number; leaseHolder?: string; force?: boolean; reason?: string } & CallOptions = {},
  ): Promise<{ session: Session; eventCount: number; position: number }> {
    const request: Input<proto.DeleteSessionRequest> = { session_id: sessionId, lease_holder: leaseHolder, force, reason };
    if (expectedSeq !== undefined) request.expected_seq = checkSeq(expectedSeq, "expectedSeq");
    const reply = await this._call("DeleteSession", request, { timeoutMs, write: true });
    return {
      session: fromSession(reply.session),
      eventCount: Number(reply.event_count ?? 0),
      position: Number(reply.position ?? 0),
    };
  }

  /**
   * Erase the data and state of events `seqs` (seq, type, time and replace stay; the events
   * come back with `redacted`). Retried on UNAVAILABLE: redacting again changes nothing.
   */
  async redactEvents(
    sessionId: string,
    seqs: number[],
    { reason = "", leaseHolder = "", timeoutMs }: { reason?: string; leaseHolder?: string } & CallOptions = {},
  ): Promise<{ seqs: number[]; position: number }> {
    const request = { session_id: sessionId, seqs: seqs.map((seq) => checkSeq(seq, "seqs")), reason, lease_holder: leaseHolder };
    const reply = await this._call("RedactEvents", request, { timeoutMs, retry: true, write: true });
    return { seqs: (reply.seqs ?? []).map(Number), position: Number(reply.position ?? 0) };
  }
}
