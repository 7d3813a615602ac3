// A LangGraph checkpointer stored in sessionlog, for LangGraph.js (`@langchain/langgraph`):
//
//   import { SessionlogSaver } from "sessionlog-client/langgraph";
//   const checkpointer = new SessionlogSaver("127.0.0.1:50051");
//   const graph = builder.compile({ checkpointer });
//   await graph.invoke(input, { configurable: { thread_id: "t-1" } });
//
// Install `@langchain/langgraph-checkpoint` beside the client (a peer dependency).
//
// The records are the Python saver's (sessionlog_client/langgraph.py), key for key:
// - one thread is one session, `<prefix><thread id>` (prefix "langgraph." unless given; a
//   character a session id cannot hold is written "-" and its UTF-8 bytes in hex, "-" itself as
//   "-2d", so the thread id reads back from the session id);
// - every record is one bookkeeping event (type step_end, never in the derived messages) whose data
//   key "langgraph" names its kind: "checkpoint" (ns, id, parent, the checkpoint without its
//   channel values and its metadata as [serde type, base64], and "blobs": the values of the
//   channels the step changed, [version, type, base64] each), "writes" (one putWrites: ns, id,
//   task, path, writes as [idx, channel, type, base64]) and "drop" (the [ns, id] pairs prune
//   removed; the log keeps them for audit).
// The serde types are the JS serializer's, so a thread is read back by the saver of the language
// that wrote it.
//
// Reads go newest first (ListEvents "seq desc", in growing pages) and stop as soon as they can: at
// the checkpoint wanted, then back to the checkpoints holding the channel values it did not change
// and to its parent (its pending writes lie after the parent). Checkpoint ids grow with the log
// (uuid6), so log order is id order.
//
// Two workers on one thread (LangGraph issue 8796): a put names, as expectedSeq, the log's length as
// this saver last saw it. When another writer appended meanwhile, the saver reads what was added:
// pending writes and other namespaces are fine (it retries past them), but a checkpoint in the same
// namespace means this worker's view is stale, and put throws StaleThreadError instead of forking
// the thread silently.

import { isDeepStrictEqual } from "node:util";

import {
  BaseCheckpointSaver,
  TASKS,
  WRITES_IDX_MAP,
  compareWritesSortKeys,
  getCheckpointId,
  maxChannelVersion,
  writesSortKey,
} from "@langchain/langgraph-checkpoint";
import type {
  ChannelVersions,
  Checkpoint,
  CheckpointListOptions,
  CheckpointMetadata,
  CheckpointPendingWrite,
  CheckpointTuple,
  DeltaChannelHistory,
  PendingWrite,
  SerializerProtocol,
  WritesSortKey,
} from "@langchain/langgraph-checkpoint";
import type { RunnableConfig } from "@langchain/core/runnables";

import { SessionLogClient, SessionLogError } from "./index.js";
import type { ClientOptions, Event, EventPage, Json, JsonObject, NewEvent } from "./index.js";

/** The data key naming a record's kind: "checkpoint", "writes" or "drop". */
export const KIND = "langgraph";
const RECORD_TYPE = "step_end";
/** The page sizes of a newest-first read, growing: most reads want the latest checkpoint. */
const PAGE_SIZES = [16, 128, 1000];
/** The most checkpoint ids one drop event names (an event is at most 1 MiB). */
const DROP_CHUNK = 2000;
/** How often a put retries past other writers' pending writes before giving up. */
const PUT_TRIES = 50;
/** The stored value of a channel its step emptied (a version with no value). */
const EMPTY = ["empty", ""];
/** How far the server's clock may run behind a worker's, in ms (see pending()). */
const CLOCK_SKEW_MS = 2000;
/** The longest a putWrites waits for this saver's puts to the thread to finish, in ms. */
const WRITES_WAIT_MS = 30_000;
const KEEP = /^[A-Za-z0-9_.]$/;

/**
 * Another worker stored a checkpoint in this thread and namespace since this saver last read it:
 * writing now would fork the thread silently. Read the thread again (getTuple) and decide; the
 * checkpoint was not stored.
 */
export class StaleThreadError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StaleThreadError";
  }
}

/** The session holding `threadId`: reversible (see threadIdOf). */
export function sessionIdOf(prefix: string, threadId: string): string {
  let kept = "";
  for (const ch of threadId) {
    if (KEEP.test(ch)) kept += ch;
    else for (const b of Buffer.from(ch, "utf8")) kept += `-${b.toString(16).padStart(2, "0")}`;
  }
  return prefix + kept;
}

/** The thread a session of this saver holds. */
export function threadIdOf(prefix: string, sessionId: string): string {
  const text = sessionId.slice(prefix.length);
  const raw: number[] = [];
  for (let i = 0; i < text.length; ) {
    if (text[i] === "-") {
      raw.push(parseInt(text.slice(i + 1, i + 3), 16));
      i += 3;
    } else {
      raw.push(...Buffer.from(text[i], "utf8"));
      i += 1;
    }
  }
  return Buffer.from(raw).toString("utf8");
}

/** A checkpoint record as stored. */
interface Found {
  seq: number;
  ns: string;
  id: string;
  parent?: string;
  data: JsonObject;
}

/** One pending write as stored: its sort key, then task, channel, serde type, base64 value. */
type Row = [WritesSortKey, string, string, string, string];

const key = (...parts: string[]): string => JSON.stringify(parts);
const strings = (value: Json | undefined): string[] => (Array.isArray(value) ? value.map(String) : []);

function kindOf(event: Event): string | undefined {
  if (event.type !== RECORD_TYPE) return undefined;
  const kind = event.data[KIND];
  return typeof kind === "string" ? kind : undefined;
}

function foundOf(event: Event): Found {
  const data = event.data;
  const parent = typeof data.parent === "string" && data.parent ? data.parent : undefined;
  return { seq: event.seq, ns: String(data.ns ?? ""), id: String(data.id ?? ""), parent, data };
}

/** Which checkpoints the events after a point dropped. Fed events newest first. */
class Scan {
  private readonly dropped = new Set<string>();

  /** Take in one (older) event; the checkpoint it stores when it is one still shown. */
  see(event: Event): Found | undefined {
    const kind = kindOf(event);
    if (kind === "drop") {
      for (const pair of (event.data.ids as Json[] | undefined) ?? []) this.dropped.add(key(...strings(pair)));
    } else if (kind === "checkpoint") {
      const found = foundOf(event);
      if (!this.dropped.has(key(found.ns, found.id))) return found;
    }
    return undefined;
  }
}

/**
 * A session's log read newest first, a page at a time as reads want older events, indexed as it
 * is read. A checkpoint stores only the channels its step changed: the value of a channel at a
 * version lies in the checkpoint that set that version, an older one, and blob() reads back to it.
 */
class Log {
  private readonly read: Event[] = [];
  private unread: Event[] = [];
  private token = "";
  private step = 0;
  private ended = false;
  private readonly blobs = new Map<string, string[]>();
  private readonly stored = new Map<string, Found>();
  private readonly writes = new Map<string, { seq: number; data: JsonObject }[]>();

  constructor(
    private readonly fetch: (pageSize: number, pageToken: string) => Promise<EventPage>,
    private readonly saw: (length: number) => void,
  ) {}

  /** The i-th newest event; undefined past the log's start. */
  async event(i: number): Promise<Event | undefined> {
    while (this.read.length <= i) {
      if (this.unread.length) this.index(this.unread.shift() as Event);
      else if (this.ended) return undefined;
      else await this.nextPage();
    }
    return this.read[i];
  }

  private async nextPage(): Promise<void> {
    const size = PAGE_SIZES[Math.min(this.step, PAGE_SIZES.length - 1)];
    const page = await this.fetch(size, this.token);
    if (this.step === 0) this.saw(page.eventCount);
    this.step += 1;
    this.unread = page.events;
    this.token = page.nextPageToken;
    this.ended = !this.token;
  }

  private index(event: Event): void {
    this.read.push(event);
    const kind = kindOf(event);
    if (kind === "checkpoint") {
      const found = foundOf(event);
      this.stored.set(key(found.ns, found.id), found);
      const blobs = (found.data.blobs ?? {}) as JsonObject;
      for (const [channel, stored] of Object.entries(blobs)) {
        const [version, ...value] = strings(stored);
        const at = key(found.ns, channel, version);
        if (!this.blobs.has(at)) this.blobs.set(at, value);
      }
    } else if (kind === "writes") {
      const at = key(String(event.data.ns ?? ""), String(event.data.id ?? ""));
      const list = this.writes.get(at) ?? [];
      list.push({ seq: event.seq, data: event.data });
      this.writes.set(at, list);
    }
  }

  private async backTo(done: () => boolean): Promise<void> {
    while (!done()) {
      if ((await this.event(this.read.length)) === undefined) return;
    }
  }

  /** The checkpoint stored with that id, dropped or not (the log keeps it). */
  async checkpoint(ns: string, id: string): Promise<Found | undefined> {
    const at = key(ns, id);
    await this.backTo(() => this.stored.has(at));
    return this.stored.get(at);
  }

  /** [type, base64] of the channel's value at `version`; undefined when no checkpoint stored it. */
  async blob(ns: string, channel: string, version: string): Promise<string[] | undefined> {
    const at = key(ns, channel, version);
    await this.backTo(() => this.blobs.has(at));
    return this.blobs.get(at);
  }

  /**
   * The writes pending on `found` (made at `madeMs`) in writesSortKey order. They lie after the
   * checkpoint's parent (the saver holds a putWrites back while one of its puts to the thread is
   * under way); for a first checkpoint, after the events the server stamped CLOCK_SKEW_MS before
   * the checkpoint's ts (the worker's clock).
   */
  async pending(found: Found, madeMs: number): Promise<Row[]> {
    if (found.parent) {
      const parent = key(found.ns, found.parent);
      await this.backTo(() => this.stored.has(parent));
    } else {
      const oldest = madeMs - CLOCK_SKEW_MS;
      await this.backTo(() => this.read.length > 0 && Date.parse(this.read[this.read.length - 1].time) < oldest);
    }
    const held = new Map<string, Row>();
    const records = [...(this.writes.get(key(found.ns, found.id)) ?? [])].sort((a, b) => a.seq - b.seq);
    for (const { data } of records) {
      const task = String(data.task ?? "");
      const path = String(data.path ?? "");
      for (const write of (data.writes as Json[] | undefined) ?? []) {
        const [idx, channel, type, value] = write as [number, string, string, string];
        const slot = key(task, String(idx));
        // the first write of a (task, idx) wins, but the last of a special channel (idx < 0:
        // an error, an interrupt, a resume)
        if (idx < 0 || !held.has(slot)) held.set(slot, [writesSortKey(path, task, idx), task, channel, type, value]);
      }
    }
    return [...held.values()].sort((a, b) => compareWritesSortKeys(a[0], b[0]));
  }
}

const encode = ([type, bytes]: [string, Uint8Array]): string[] => [type, Buffer.from(bytes).toString("base64")];
const decodeBytes = (value: string): Uint8Array => new Uint8Array(Buffer.from(value, "base64"));

function record(data: JsonObject): NewEvent {
  return { type: RECORD_TYPE, data };
}

interface Settings {
  /** Starts every session id this saver uses (a letter, digit or "_" first). Default "langgraph.". */
  prefix?: string;
  /** The serializer of checkpoints, metadata and writes (LangGraph's JsonPlusSerializer by default). */
  serde?: SerializerProtocol;
  /** Options of the client this saver opens when given an address. */
  clientOptions?: ClientOptions;
}

/** The thread id, the session and the checkpoint_ns a config names. */
interface Place {
  threadId: string;
  sessionId: string;
  ns: string;
}

/**
 * LangGraph.js's BaseCheckpointSaver over a sessionlog server. `client` is a SessionLogClient
 * (its owner closes it) or an address (close() closes the client the saver opens).
 */
export class SessionlogSaver extends BaseCheckpointSaver<string> {
  readonly client: SessionLogClient;
  readonly prefix: string;
  private readonly ownClient: boolean;
  /** Per session: the log's length as this saver last saw it. */
  private readonly seen = new Map<string, number>();
  /** Per session: this saver's puts under way (a putWrites waits for them). */
  private readonly putting = new Map<string, Set<Promise<unknown>>>();

  constructor(client: SessionLogClient | string | string[], { prefix = "langgraph.", serde, clientOptions }: Settings = {}) {
    super(serde);
    if (!/^[\p{L}\p{N}_]/u.test(prefix)) throw new Error("prefix must start with a letter, a digit or '_'");
    this.prefix = prefix;
    this.ownClient = !(client instanceof SessionLogClient);
    this.client = client instanceof SessionLogClient ? client : new SessionLogClient(client, clientOptions);
  }

  /** Closes the client the saver opened from an address (not one it was given). */
  close(): void {
    if (this.ownClient) this.client.close();
  }

  /**
   * A version that grows and is unique across branches: a value is stored once per (namespace,
   * channel, version), and two branches forked from one checkpoint both step a channel from the
   * same version.
   */
  override getNextVersion(current: string | undefined): string {
    const number = current === undefined ? 0 : parseInt(String(current).split(".")[0], 10) || 0;
    const random = Math.random().toFixed(16).slice(2);
    return `${String(number + 1).padStart(32, "0")}.${random}`;
  }

  // -- what this saver has seen of each log ----------------------------------------------------

  private saw(sessionId: string, length: number): void {
    this.seen.set(sessionId, Math.max(this.seen.get(sessionId) ?? 0, length));
  }

  /** An append of ours landed at firstSeq: the view moves on only when nothing another writer
   * appended lies between it and what this saver had seen. */
  private wrote(sessionId: string, firstSeq: number, nextSeq: number): void {
    if (this.seen.get(sessionId) === firstSeq) this.seen.set(sessionId, nextSeq);
  }

  private place(config: RunnableConfig): Place {
    const configurable = config.configurable;
    if (!configurable) throw new Error("config.configurable is missing: it names the thread (thread_id)");
    const threadId = configurable.thread_id;
    if (threadId === undefined || threadId === null || threadId === "") {
      throw new Error("config.configurable.thread_id is missing: it names the thread");
    }
    return {
      threadId: String(threadId),
      sessionId: sessionIdOf(this.prefix, String(threadId)),
      ns: String(configurable.checkpoint_ns ?? ""),
    };
  }

  private log(sessionId: string): Log {
    return new Log(
      (pageSize, pageToken) => this.client.listEvents(sessionId, { pageSize, pageToken, orderBy: "seq desc" }),
      (length) => this.saw(sessionId, length),
    );
  }

  // -- reading ---------------------------------------------------------------------------------

  private async loads(stored: Json | undefined): Promise<any> {
    const [type, value] = strings(stored);
    return this.serde.loadsTyped(type, decodeBytes(value ?? ""));
  }

  private async tuple(threadId: string, found: Found, log: Log): Promise<CheckpointTuple> {
    const checkpoint = (await this.loads(found.data.checkpoint)) as Checkpoint;
    const values: Record<string, unknown> = {};
    for (const [channel, version] of Object.entries(checkpoint.channel_versions ?? {})) {
      const stored = await log.blob(found.ns, channel, String(version));
      if (stored !== undefined && stored[0] !== EMPTY[0]) values[channel] = await this.serde.loadsTyped(stored[0], decodeBytes(stored[1]));
    }
    checkpoint.channel_values = values;
    if (checkpoint.v < 4 && found.parent) await this.migrateSends(checkpoint, found, log);
    const pendingWrites: CheckpointPendingWrite[] = [];
    for (const [, task, channel, type, value] of await log.pending(found, Date.parse(checkpoint.ts))) {
      pendingWrites.push([task, channel, await this.serde.loadsTyped(type, decodeBytes(value))]);
    }
    const tuple: CheckpointTuple = {
      config: { configurable: { thread_id: threadId, checkpoint_ns: found.ns, checkpoint_id: found.id } },
      checkpoint,
      metadata: (await this.loads(found.data.metadata)) as CheckpointMetadata,
      pendingWrites,
    };
    if (found.parent) {
      tuple.parentConfig = { configurable: { thread_id: threadId, checkpoint_ns: found.ns, checkpoint_id: found.parent } };
    }
    return tuple;
  }

  /** A checkpoint of format v < 4 gets its parent's pending sends as its TASKS channel. */
  private async migrateSends(checkpoint: Checkpoint, found: Found, log: Log): Promise<void> {
    const parent = await log.checkpoint(found.ns, found.parent as string);
    if (parent === undefined) return;
    const parentCheckpoint = (await this.loads(parent.data.checkpoint)) as Checkpoint;
    const sends: unknown[] = [];
    for (const [, , channel, type, value] of await log.pending(parent, Date.parse(parentCheckpoint.ts))) {
      if (channel === TASKS) sends.push(await this.serde.loadsTyped(type, decodeBytes(value)));
    }
    const values = checkpoint.channel_values as Record<string, unknown>;
    const versions = checkpoint.channel_versions as Record<string, string | number>;
    values[TASKS] = sends;
    const known = Object.values(versions);
    versions[TASKS] = known.length ? maxChannelVersion(...known) : this.getNextVersion(undefined);
  }

  /** Every checkpoint still shown, newest first. */
  private async *checkpoints(log: Log): AsyncGenerator<Found> {
    const scan = new Scan();
    for (let i = 0; ; i += 1) {
      const event = await log.event(i);
      if (event === undefined) return;
      const found = scan.see(event);
      if (found !== undefined) yield found;
    }
  }

  /** The checkpoint `config` names, or the latest of its namespace. */
  private async find(config: RunnableConfig, ns: string, log: Log): Promise<Found | undefined> {
    const wanted = getCheckpointId(config);
    for await (const found of this.checkpoints(log)) {
      if (found.ns === ns && (!wanted || found.id === wanted)) return found;
    }
    return undefined;
  }

  /**
   * The checkpoint `config` names (its checkpoint_id), or the thread's latest in its namespace;
   * undefined when there is none or the config names no thread. Reads back from the end to it.
   */
  async getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined> {
    const threadId = config.configurable?.thread_id;
    if (threadId === undefined || threadId === null || threadId === "") return undefined;
    const { sessionId, ns } = this.place(config);
    const log = this.log(sessionId);
    const found = await this.find(config, ns, log);
    return found === undefined ? undefined : this.tuple(String(threadId), found, log);
  }

  /**
   * The checkpoints of a thread (of every thread under the prefix when the config names none),
   * newest first: those whose metadata has every `filter` item, older than `before`'s checkpoint,
   * at most `limit`. Without checkpoint_ns in the config, every namespace.
   */
  async *list(config: RunnableConfig, options: CheckpointListOptions = {}): AsyncGenerator<CheckpointTuple> {
    const { before, filter, limit } = options;
    if (limit !== undefined && limit <= 0) return;
    const configurable = config.configurable ?? {};
    const threads: string[] = [];
    if (configurable.thread_id !== undefined && configurable.thread_id !== null && configurable.thread_id !== "") {
      threads.push(String(configurable.thread_id));
    } else {
      for await (const page of this.client.listSessions({ prefix: this.prefix })) {
        for (const session of page.sessions) threads.push(threadIdOf(this.prefix, session.sessionId));
      }
    }
    const ns = configurable.checkpoint_ns === undefined ? undefined : String(configurable.checkpoint_ns);
    const only = configurable.checkpoint_id ? String(configurable.checkpoint_id) : undefined;
    const beforeId = before?.configurable?.checkpoint_id ? String(before.configurable.checkpoint_id) : undefined;
    let left = limit;
    for (const threadId of threads) {
      const log = this.log(sessionIdOf(this.prefix, threadId));
      for await (const found of this.checkpoints(log)) {
        if (ns !== undefined && found.ns !== ns) continue;
        if (only !== undefined && found.id !== only) continue;
        if (beforeId !== undefined && found.id >= beforeId) continue;
        const tuple = await this.tuple(threadId, found, log);
        const metadata = (tuple.metadata ?? {}) as Record<string, unknown>;
        if (filter && !Object.entries(filter).every(([k, v]) => isDeepStrictEqual(metadata[k], v))) continue;
        yield tuple;
        if (left !== undefined) {
          left -= 1;
          if (left === 0) return;
        }
      }
    }
  }

  /**
   * The writes of each channel along the checkpoint's ancestors, back to the nearest one that
   * stored its value (the seed), in one newest-first read. Ancestors that prune dropped still
   * count: the log keeps them.
   */
  override async getDeltaChannelHistory({
    config,
    channels,
  }: {
    config: RunnableConfig;
    channels: string[];
  }): Promise<Record<string, DeltaChannelHistory>> {
    if (channels.length === 0) return {};
    const { sessionId, ns } = this.place(config);
    const log = this.log(sessionId);
    const target = await this.find(config, ns, log);
    const writes: Record<string, CheckpointPendingWrite[]> = Object.fromEntries(channels.map((c) => [c, []]));
    const seeds = new Map<string, unknown>();
    const left = new Set(channels);
    let cursor = target?.parent;
    while (cursor && left.size) {
      const found = await log.checkpoint(ns, cursor);
      if (found === undefined) break;
      const checkpoint = (await this.loads(found.data.checkpoint)) as Checkpoint;
      const rows = await log.pending(found, Date.parse(checkpoint.ts));
      for (const [, task, channel, type, value] of [...rows].reverse()) {
        if (left.has(channel)) writes[channel].push([task, channel, await this.serde.loadsTyped(type, decodeBytes(value))]);
      }
      for (const channel of [...left]) {
        const version = (checkpoint.channel_versions as Record<string, unknown>)[channel];
        const stored = version === undefined ? undefined : await log.blob(ns, channel, String(version));
        if (stored !== undefined && stored[0] !== EMPTY[0]) {
          seeds.set(channel, await this.serde.loadsTyped(stored[0], decodeBytes(stored[1])));
          left.delete(channel);
        }
      }
      cursor = found.parent;
    }
    const history: Record<string, DeltaChannelHistory> = {};
    for (const channel of channels) {
      const entry: DeltaChannelHistory = { writes: writes[channel].reverse() };
      if (seeds.has(channel)) entry.seed = seeds.get(channel);
      history[channel] = entry;
    }
    return history;
  }

  // -- writing ---------------------------------------------------------------------------------

  /**
   * Store a checkpoint as one event, refusing to fork the thread behind another worker's back
   * (StaleThreadError).
   */
  async put(
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    newVersions: ChannelVersions,
  ): Promise<RunnableConfig> {
    const { threadId, sessionId, ns } = this.place(config);
    const values = (checkpoint.channel_values ?? {}) as Record<string, unknown>;
    const blobs: JsonObject = {};
    for (const [channel, version] of Object.entries(newVersions)) {
      blobs[channel] = [String(version), ...(channel in values ? encode(await this.serde.dumpsTyped(values[channel])) : EMPTY)];
    }
    const data: JsonObject = {
      [KIND]: "checkpoint",
      ns,
      id: checkpoint.id,
      checkpoint: encode(await this.serde.dumpsTyped({ ...checkpoint, channel_values: {} })),
      blobs,
      metadata: encode(await this.serde.dumpsTyped(metadata)),
    };
    const parent = config.configurable?.checkpoint_id;
    if (parent) data.parent = String(parent);
    const under = this.putting.get(sessionId) ?? new Set<Promise<unknown>>();
    this.putting.set(sessionId, under);
    const done = this.appendChecked(sessionId, ns, record(data));
    under.add(done);
    try {
      await done;
    } finally {
      under.delete(done);
      if (under.size === 0) this.putting.delete(sessionId);
    }
    return { configurable: { thread_id: threadId, checkpoint_ns: ns, checkpoint_id: checkpoint.id } };
  }

  private async appendChecked(sessionId: string, ns: string, event: NewEvent): Promise<void> {
    let expected = this.seen.get(sessionId);
    for (let tries = 0; tries < PUT_TRIES; tries += 1) {
      try {
        const reply = await this.client.append(sessionId, [event], { expectedSeq: expected });
        this.saw(sessionId, reply.nextSeq);
        return;
      } catch (error) {
        if (!(error instanceof SessionLogError) || error.reason !== "SEQ_CONFLICT" || expected === undefined) throw error;
        const added: Event[] = [];
        for await (const one of this.client.since(sessionId, { seq: expected })) added.push(one);
        expected = this.afterConflict(sessionId, ns, expected, added);
      }
    }
    throw new StaleThreadError(`thread session ${JSON.stringify(sessionId)}: too many concurrent writers`);
  }

  /** What another writer appended since `expected`: the new expected seq when it holds no
   * checkpoint of `ns`, else StaleThreadError. */
  private afterConflict(sessionId: string, ns: string, expected: number, added: Event[]): number {
    const scan = new Scan();
    for (const event of [...added].reverse()) {
      const found = scan.see(event);
      if (found !== undefined && found.ns === ns) {
        throw new StaleThreadError(
          `thread session ${JSON.stringify(sessionId)}: checkpoint ${JSON.stringify(found.id)} (seq ${found.seq}) was ` +
            `stored in namespace ${JSON.stringify(ns)} since this saver read the thread; read it again before writing`,
        );
      }
    }
    this.saw(sessionId, expected + added.length);
    return expected + added.length;
  }

  /** Store one task's writes pending on a checkpoint as one event. */
  async putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string, taskPath = ""): Promise<void> {
    const { sessionId, ns } = this.place(config);
    const checkpointId = config.configurable?.checkpoint_id;
    if (!checkpointId) throw new Error("config.configurable.checkpoint_id is missing: writes are pending on a checkpoint");
    const rows: Json[] = [];
    for (const [idx, [channel, value]] of writes.entries()) {
      rows.push([WRITES_IDX_MAP[channel] ?? idx, channel, ...encode(await this.serde.dumpsTyped(value))]);
    }
    const data: JsonObject = { [KIND]: "writes", ns, id: String(checkpointId), task: taskId, path: taskPath, writes: rows };
    const under = this.putting.get(sessionId);
    if (under?.size) {
      // after the checkpoint they name (see Log.pending)
      let timer: NodeJS.Timeout | undefined;
      const waited = new Promise((done) => {
        timer = setTimeout(done, WRITES_WAIT_MS);
      });
      await Promise.race([Promise.allSettled([...under]), waited]);
      clearTimeout(timer);
    }
    const reply = await this.client.append(sessionId, [record(data)]);
    this.wrote(sessionId, reply.events[0].seq, reply.nextSeq);
  }

  /** Delete the thread's session (nothing happens for a thread never written). */
  async deleteThread(threadId: string): Promise<void> {
    const sessionId = sessionIdOf(this.prefix, String(threadId));
    try {
      await this.client.deleteSession(sessionId, { reason: "langgraph deleteThread" });
    } catch (error) {
      if (!(error instanceof SessionLogError) || error.reason !== "SESSION_NOT_FOUND") throw error;
    }
    this.seen.delete(sessionId);
  }

  /** Fork the source thread's session, whole, into the target's (which must not exist). Nothing
   * happens for a source never written. */
  async copyThread(sourceThreadId: string, targetThreadId: string): Promise<void> {
    const source = sessionIdOf(this.prefix, sourceThreadId);
    if (!(await this.client.getSession(source)).session.eventCount) return;
    await this.client.forkSession(source, { sessionId: sessionIdOf(this.prefix, targetThreadId) });
  }

  /** "keepLatest": drop every checkpoint but the latest of each namespace (its writes stay);
   * "delete": delete the threads. */
  async prune(threadIds: string[], { strategy = "keepLatest" }: { strategy?: "keepLatest" | "delete" } = {}): Promise<void> {
    if (strategy !== "keepLatest" && strategy !== "delete") throw new Error(`unknown prune strategy ${JSON.stringify(strategy)}`);
    for (const threadId of threadIds) {
      if (strategy === "delete") await this.deleteThread(threadId);
      else await this.dropOlder(sessionIdOf(this.prefix, threadId));
    }
  }

  /** Drop all but the latest checkpoint of each namespace (a drop record; the log keeps them). */
  private async dropOlder(sessionId: string): Promise<void> {
    const kept = new Set<string>();
    const drop: string[][] = [];
    for await (const found of this.checkpoints(this.log(sessionId))) {
      if (kept.has(found.ns)) drop.push([found.ns, found.id]);
      kept.add(found.ns);
    }
    for (let start = 0; start < drop.length; start += DROP_CHUNK) {
      const reply = await this.client.append(sessionId, [record({ [KIND]: "drop", ids: drop.slice(start, start + DROP_CHUNK) })]);
      this.wrote(sessionId, reply.events[0].seq, reply.nextSeq);
    }
  }
}
