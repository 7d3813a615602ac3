// Pipelined appends over one AppendStream call (issue 33): a worker that writes many appends
// sends each as soon as it has it and learns each one's fate from its own promise, instead of
// waiting a round trip (and a commit) per append.
//
//   const stream = client.appendStream();
//   const first = stream.append("a", [event1]);
//   const second = stream.append("b", [event2], { expectedSeq: 7 });
//   await stream.close(); // half-close: every answer is in once it resolves
//
// Invariants:
// - Requests go out in the order append() was called (a call waiting for a slot in the window
//   holds back every later one), so appends to one session are written in that order.
// - Each request has its own correlation_id (a counter); its answer settles exactly its promise:
//   an AppendStreamError rejects that promise alone, as client.append would have thrown.
// - At most maxInFlight requests are unanswered; append() past that waits for an answer.
// - The call's own end before every answer came (a dropped connection, a server stopping, a
//   deadline, cancel()) rejects every promise still pending, and every later append(), with
//   that one error. A broken stream is not reopened: appends in flight may or may not have been
//   written (send them again with the same requestId on a new stream to find out safely).
// - A NOT_PRIMARY answer points the client at the primary it names (as a unary call's would):
//   the stream stays where it is, a new one goes there.
// - Epochs, as for unary writes (see "Epochs:" in index.ts): the call carries the highest
//   epoch the client has seen (of the group of its first append's session), so a server below
//   it (a deposed primary restarted unfenced) refuses each append NOT_PRIMARY and writes
//   nothing. The server names its epoch in the stream's headers, before any answer (and in its
//   trailers again): the client learns it there, and judges each answer by the headers'. An append a server below the epoch the
//   client has seen acknowledged (one too old to refuse, or a newer epoch learnt meanwhile) is
//   not an acknowledgement: it rejects with LeadershipLostError (committed: send it again with
//   its requestId); a NOT_PRIMARY of such a server names no primary to follow (the next
//   member is tried).

import { randomUUID } from "node:crypto";

import * as grpc from "@grpc/grpc-js";

import { errorFor, SessionLogError, toError } from "./errors.js";
import type * as proto from "./proto.js";
import type { Input } from "./proto.js";
import type { AppendOptions, AppendResult, NewEvent } from "./types.js";
import { appendRequest, appendResult } from "./values.js";

/** How many appends an AppendStream keeps unanswered at once unless told otherwise. */
export const DEFAULT_MAX_IN_FLIGHT = 256;

export interface AppendStreamOptions {
  /** At most this many appends unanswered at once; append() past it waits. Default 256. */
  maxInFlight?: number;
}

/**
 * The options of one append on an AppendStream: client.append's, without timeoutMs (a stream
 * has no per-append deadline). requestId: a fresh UUID when absent, as client.append's, "" for
 * none; nothing resends it here: give your own to send an append again safely after a broken
 * stream.
 */
export type StreamAppendOptions = Omit<AppendOptions, "timeoutMs">;

/** @internal A server the stream's client knows (the client's own record of it). */
export interface StreamMember {
  address: string;
  stub: grpc.Client;
  reached: boolean;
}

/**
 * @internal What an AppendStream asks of the client that opens it (SessionLogClient): its
 * routing, its calls' metadata, what a failure or a NOT_PRIMARY answer means. An interface, so
 * that this module needs nothing of index.ts, which imports it (no import circle).
 */
export interface StreamClient {
  readonly waitForReadyCalls: boolean;
  _pick(): Promise<StreamMember | null>;
  _nobody(): SessionLogError;
  _settle(member: StreamMember, timeoutMs: number): Promise<void>;
  _streamMetadata(sessionId: string): grpc.Metadata;
  _opened(member: StreamMember, headers: grpc.Metadata): { epoch: number; group: string };
  _seen(group: string): number;
  _accepted(member: StreamMember, headers: grpc.Metadata | undefined, sessionId: string): void;
  _notPrimary(member: StreamMember, metadata: Record<string, string>, group?: string, current?: boolean): unknown;
  _after(member: StreamMember, thrown: unknown, retry: boolean, hops: number, deadlineMoves?: boolean, sessionId?: string, stream?: boolean): unknown;
}

type Member = StreamMember;
type Call = grpc.ClientDuplexStream<Input<proto.AppendStreamRequest>, proto.AppendStreamResponse>;
type DuplexRpc = (metadata: grpc.Metadata, options: grpc.CallOptions) => Call;

interface Pending {
  sessionId: string;
  done: (result: AppendResult) => void;
  fail: (error: unknown) => void;
}

/**
 * Appends pipelined over one bidirectional AppendStream call (client.appendStream()). Each
 * append() resolves to what client.append resolves to once its events are durable, or rejects
 * with the error client.append would throw (a SessionLogError of the reason's own class, with
 * code, reason and metadata); one append's error leaves the others and the stream alone.
 * `await close()` half-closes and resolves once every append sent has its answer; cancel() ends
 * at once. The call is opened by the first append.
 */
export class AppendStream {
  /** The window: at most this many appends unanswered at once. */
  readonly maxInFlight: number;
  /** The error that ended the stream before its close, if one did. */
  error: SessionLogError | Error | null;
  /** @internal */
  _forget: (() => void) | null;
  private readonly _client: StreamClient;
  private readonly _pending: Map<number, Pending>;
  /** Appends waiting for a slot in the window, first come first sent (go sends at once). */
  private readonly _waiting: Array<{ go: () => void; fail: (error: unknown) => void }>;
  /** Requests made before the call was open, sent in order once it is. */
  private readonly _unsent: Input<proto.AppendStreamRequest>[];
  private _nextId: number;
  private _call: Call | null;
  private _opening: boolean;
  private _closing: boolean;
  private _ended: boolean;
  private readonly _endWaiters: Array<() => void>;
  /** The stream's headers: the epoch (and group) its server named as it opened. */
  private _headers: grpc.Metadata | undefined;
  private _epoch: number;
  private _group: string;

  /** @internal */
  constructor(client: StreamClient, { maxInFlight = DEFAULT_MAX_IN_FLIGHT }: AppendStreamOptions = {}) {
    if (!Number.isSafeInteger(maxInFlight) || maxInFlight < 1) {
      throw new RangeError(`maxInFlight must be a whole number, 1 or more (got ${maxInFlight})`);
    }
    this.maxInFlight = maxInFlight;
    this.error = null;
    this._forget = null;
    this._client = client;
    this._pending = new Map();
    this._waiting = [];
    this._unsent = [];
    this._nextId = 1;
    this._call = null;
    this._opening = false;
    this._closing = false;
    this._ended = false;
    this._endWaiters = [];
    this._headers = undefined;
    this._epoch = 0;
    this._group = "";
  }

  /** How many appends are sent and not yet answered. */
  get inFlight(): number {
    return this._pending.size;
  }

  /**
   * Send an append now (or, with maxInFlight unanswered, as soon as one is answered); resolves
   * with its AppendResult once durable, rejects with its own error or the stream's.
   */
  append(sessionId: string, events: NewEvent[], options: StreamAppendOptions = {}): Promise<AppendResult> {
    let request: Input<proto.AppendRequest>;
    try {
      request = appendRequest(sessionId, events, { ...options, requestId: options.requestId ?? randomUUID() });
    } catch (error) {
      return Promise.reject(error);
    }
    if (this.error) return Promise.reject(this.error);
    if (this._closing || this._ended) {
      return Promise.reject(new Error("this AppendStream is closed: open another with client.appendStream()"));
    }
    if (this._pending.size < this.maxInFlight && !this._waiting.length) return this._send(request);
    return new Promise<AppendResult>((done, fail) => this._waiting.push({ go: () => done(this._send(request)), fail }));
  }

  /**
   * Half-close: no append is taken after it; resolves once every append already taken (those
   * waiting for a slot too) has its answer and the call has ended. It never rejects: each
   * append's promise carries its own outcome (and `error` the stream's, if it broke).
   */
  async close(): Promise<void> {
    this._closing = true;
    if (this._ended) return;
    const ended = new Promise<void>((done) => this._endWaiters.push(done));
    this._endIfDone();
    await ended;
  }

  /** End now: every append not yet answered rejects with CANCELLED (they may have been written). */
  cancel(): void {
    this._break(
      new SessionLogError("the AppendStream was cancelled by its caller; appends not yet answered may or may not be written", {
        code: grpc.status.CANCELLED,
      }),
    );
  }

  /** Register request's promise under a new correlation id and send it (or queue it until open). */
  private _send(request: Input<proto.AppendRequest>): Promise<AppendResult> {
    const correlation_id = this._nextId++;
    const sessionId = request.session_id ?? "";
    const answered = new Promise<AppendResult>((done, fail) =>
      this._pending.set(correlation_id, { sessionId, done, fail }),
    );
    const message = { append: request, correlation_id };
    if (this._call) this._call.write(message);
    else {
      this._unsent.push(message);
      if (!this._opening) void this._open(sessionId);
    }
    this._endIfDone();
    return answered;
  }

  /** Open the call on the client's current member and send what was queued meanwhile;
   * sessionId: the first append's (whose group's epoch the call carries). */
  private async _open(sessionId: string): Promise<void> {
    this._opening = true;
    const client = this._client;
    let member: Member | null = null;
    try {
      member = await client._pick();
      if (!member) throw client._nobody();
      await client._settle(member, Infinity);
    } catch (error) {
      this._break(this._failure(member, error));
      return;
    }
    if (this._ended) return;
    const options: grpc.CallOptions & { waitForReady?: boolean } = {};
    if (client.waitForReadyCalls) options.waitForReady = true;
    const rpc = (member.stub as unknown as Record<string, DuplexRpc>).AppendStream;
    const call = rpc.call(member.stub, client._streamMetadata(sessionId), options);
    const opened = member;
    // grpc-js delivers the headers before any message.
    call.on("metadata", (headers: grpc.Metadata) => {
      this._headers = headers;
      ({ epoch: this._epoch, group: this._group } = client._opened(opened, headers));
    });
    call.on("data", (response: proto.AppendStreamResponse) => {
      opened.reached = true;
      this._answer(opened, response);
    });
    // The trailers name the epoch again: a fresh store's first writes make its epoch 1.
    call.on("status", (status: grpc.StatusObject) => {
      if (status.code === grpc.status.OK) client._opened(opened, status.metadata);
    });
    call.on("error", (error: grpc.ServiceError) => this._break(this._failure(opened, error)));
    // "end" comes after every answer was delivered (and only when the status was OK).
    call.on("end", () => {
      if (this._pending.size || this._waiting.length) {
        this._break(
          new SessionLogError(
            `the server ended the AppendStream with ${this._pending.size + this._waiting.length} appends unanswered; they may or may not be written`,
            { code: grpc.status.UNAVAILABLE },
          ),
        );
      } else this._finish();
    });
    this._call = call;
    for (const message of this._unsent.splice(0)) call.write(message);
    this._endIfDone();
  }

  /** One answer from member: settle its append's promise and hand its slot on. */
  private _answer(member: Member, response: proto.AppendStreamResponse): void {
    const id = Number(response.correlation_id);
    const pending = this._pending.get(id);
    if (!pending) return; // not ours (cannot happen with a well-behaved server)
    this._pending.delete(id);
    if (response.result === "append" && response.append) {
      try {
        this._client._accepted(member, this._headers, pending.sessionId);
        pending.done(appendResult(response.append));
      } catch (lost) {
        pending.fail(lost); // taken by a server below the epoch seen: not an acknowledgement
      }
    } else {
      const failed = response.error;
      const error = errorFor(failed?.message ?? "", {
        code: failed?.code ?? grpc.status.UNKNOWN,
        reason: failed?.reason || undefined,
        domain: failed?.reason ? "sessionlog" : "",
        metadata: { ...(failed?.metadata ?? {}) },
      });
      if (error.reason === "NOT_PRIMARY") {
        const current = !this._epoch || this._epoch >= this._client._seen(this._group);
        this._client._notPrimary(member, error.metadata, this._group, current);
      }
      pending.fail(error);
    }
    this._release();
  }

  /** A slot is free: the first waiting append, if any, is sent in it now. */
  private _release(): void {
    this._waiting.shift()?.go();
  }

  /** Once closing and nothing waits for a slot, half-close the call (or finish: nothing was sent). */
  private _endIfDone(): void {
    if (!this._closing || this._waiting.length || this._ended) return;
    if (this._call) this._call.end();
    else if (!this._opening) this._finish();
  }

  /** What the call's failure on member means, as the client's routing sees it (a NOT_PRIMARY
   * moves it to the next member; an address never reached says so). */
  private _failure(member: Member | null, error: unknown): SessionLogError | Error {
    let failure = error;
    if (member) {
      try {
        this._client._after(member, error, false, 0, false, "", true);
      } catch (unreachable) {
        failure = unreachable;
      }
    }
    return toError(failure) as SessionLogError | Error;
  }

  /** The stream ended by error: every promise still pending, and every waiting append, rejects. */
  private _break(error: SessionLogError | Error): void {
    if (this._ended) return;
    this._ended = true; // before cancel(), whose own "error" comes back here
    this.error = error;
    const pending = [...this._pending.values()];
    const waiting = this._waiting.splice(0);
    this._pending.clear();
    this._call?.cancel();
    for (const { fail } of pending) fail(error);
    for (const { fail } of waiting) fail(error);
    this._finish();
  }

  private _finish(): void {
    this._ended = true;
    this._forget?.();
    for (const done of this._endWaiters.splice(0)) done();
  }
}
