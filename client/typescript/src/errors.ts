// The errors of sessionlog's Node client: SessionLogError and its classes per reason, read from
// a grpc-js failure's google.rpc.ErrorInfo (grpc-status-details-bin). Below values.ts,
// append-stream.ts and index.ts; it imports none of them.

import * as grpc from "@grpc/grpc-js";
import protobuf from "protobufjs";

/** @internal */
export type Failure = Partial<grpc.ServiceError> & { settle?: boolean; reason?: string; cause?: unknown };

/** The options of a SessionLogError. */
export interface SessionLogErrorOptions {
  code?: number;
  reason?: string;
  domain?: string;
  metadata?: Record<string, string>;
  cause?: unknown;
}

const STATUS_DETAILS_KEY = "grpc-status-details-bin";

const rpcTypes = protobuf.Root.fromJSON(<protobuf.INamespace>{
  nested: {
    google: {
      nested: {
        rpc: {
          nested: {
            Any: { fields: { type_url: { type: "string", id: 1 }, value: { type: "bytes", id: 2 } } },
            Status: {
              fields: {
                code: { type: "int32", id: 1 },
                message: { type: "string", id: 2 },
                details: { rule: "repeated", type: "Any", id: 3 },
              },
            },
            ErrorInfo: {
              fields: {
                reason: { type: "string", id: 1 },
                domain: { type: "string", id: 2 },
                metadata: { keyType: "string", type: "string", id: 3 },
              },
            },
          },
        },
      },
    },
  },
});
const StatusType = rpcTypes.lookupType("google.rpc.Status");
const ErrorInfoType = rpcTypes.lookupType("google.rpc.ErrorInfo");
const CODE_NAMES: Record<number, string> = Object.fromEntries(Object.entries(grpc.status).map(([name, code]) => [code, name]));

/**
 * A failed call. `reason` is the server's stable reason (e.g. "SEQ_CONFLICT") from the
 * google.rpc.ErrorInfo detail, `metadata` its values (e.g. { next_seq: "4" }); a failure with no
 * detail (a refused connection, a deadline) has the status name as its reason.
 */
export class SessionLogError extends Error {
  readonly code: number;
  readonly codeName: string;
  readonly reason: string;
  readonly domain: string;
  readonly metadata: Record<string, string>;
  /** @internal A connection that never came up within connectTimeoutMs (_settle). */
  settle?: boolean;

  constructor(message: string, { code, reason, domain = "", metadata = {}, cause }: SessionLogErrorOptions = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = "SessionLogError";
    this.code = code as number;
    this.codeName = CODE_NAMES[code as number] ?? "UNKNOWN";
    this.reason = reason ?? this.codeName;
    this.domain = domain;
    this.metadata = metadata;
  }
}

/** The ErrorInfo in a grpc-js error's trailers, decoded from grpc-status-details-bin. */
export function errorInfo(
  error: unknown,
): { reason: string; domain: string; metadata: Record<string, string> } | null {
  const raw = (error as Failure | null)?.metadata?.get?.(STATUS_DETAILS_KEY) ?? [];
  for (const value of raw) {
    const status = StatusType.toObject(StatusType.decode(Buffer.isBuffer(value) ? value : Buffer.from(value)));
    for (const detail of (status.details ?? []) as { type_url: string; value: Uint8Array }[]) {
      if (detail.type_url.endsWith("/google.rpc.ErrorInfo")) {
        const info = ErrorInfoType.toObject(ErrorInfoType.decode(detail.value), { defaults: true }) as {
          reason: string;
          domain: string;
          metadata: Record<string, string>;
        };
        return { reason: info.reason, domain: info.domain, metadata: { ...info.metadata } };
      }
    }
  }
  return null;
}

/** @internal The whole number text names (0 for anything else). */
export const whole = (text: unknown): number => (/^[0-9]+$/.test(String(text ?? "")) ? Number(text) : 0);

/**
 * NOT_PRIMARY: a write sent to a server that does not take writes (a replica, a fenced primary,
 * or one whose epoch is below the one this client has seen). Nothing was written. `primary` is
 * where writes go ("" when the server knows no primary), `epoch` the highest epoch it knows.
 */
export class NotPrimaryError extends SessionLogError {
  /** Where writes go, as the server knows it ("" when it knows no primary). */
  readonly primary: string;
  /** The highest leadership epoch the server knows. */
  readonly epoch: number;

  constructor(message: string, options: SessionLogErrorOptions = {}) {
    super(message, { ...options, reason: "NOT_PRIMARY" });
    this.name = "NotPrimaryError";
    this.primary = this.metadata.primary ?? "";
    this.epoch = whole(this.metadata.epoch);
  }
}

/**
 * LEADERSHIP_LOST (UNAVAILABLE): the server lost its leadership while the write was in flight,
 * or a deposed server took it; it is not acknowledged. `committed`: it may be stored (retry with
 * the same requestId against the current primary: it finds the write if it survived).
 */
export class LeadershipLostError extends SessionLogError {
  /** The write may be stored (it finds itself on a retry with its requestId if it survived). */
  readonly committed: boolean;

  constructor(message: string, options: SessionLogErrorOptions = {}) {
    super(message, { ...options, reason: "LEADERSHIP_LOST" });
    this.name = "LeadershipLostError";
    this.committed = String(this.metadata.committed ?? "").toLowerCase() === "true";
  }
}

/**
 * REPLICAS_UNAVAILABLE (UNAVAILABLE, `--ack replica`): committed locally: retry with the same
 * request id is safe. The primary holds the write, but fewer than `needed` (--sync-replicas)
 * replicas reported it within --sync-timeout (`counted` did); `position` is its change-feed
 * position. A retry with the same requestId returns the original result once enough replicas
 * hold it, without writing again.
 */
export class ReplicasUnavailableError extends SessionLogError {
  /** --sync-replicas: how many replicas must hold a write before it is acknowledged. */
  readonly needed: number;
  /** How many counting replicas reported holding it in time. */
  readonly counted: number;
  /** Its change-feed position on the primary. */
  readonly position: number;

  constructor(message: string, options: SessionLogErrorOptions = {}) {
    super(message, { ...options, reason: "REPLICAS_UNAVAILABLE" });
    this.name = "ReplicasUnavailableError";
    this.needed = whole(this.metadata.needed);
    this.counted = whole(this.metadata.counted);
    this.position = whole(this.metadata.position);
  }
}

/**
 * WRONG_GROUP (FAILED_PRECONDITION, a server with --shard-map): another group owns the session's
 * slot; nothing was done. `group` is the owner, `primary` its primary ("" when unknown),
 * `members` its members, `slot` the session's slot, `mapEpoch` the epoch of the server's map.
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

  constructor(message: string, options: SessionLogErrorOptions = {}) {
    super(message, { ...options, reason: "WRONG_GROUP" });
    this.name = "WrongGroupError";
    this.group = this.metadata.group ?? "";
    this.primary = this.metadata.primary ?? "";
    this.members = this.metadata.members ? this.metadata.members.split(",") : [];
    this.slot = whole(this.metadata.slot);
    this.mapEpoch = whole(this.metadata.map_epoch);
  }
}

/**
 * DATA_CORRUPTED (DATA_LOSS): a stored record could not be read back, so the data file is damaged.
 * The server says so for what it parses (Surface, DeriveMessages, a write); a stream (since(),
 * follow()) sends events as they are stored, so this client is the one to find an event that
 * does not decode, and says it with this class too. Nothing is guessed: `sessionlog admin
 * verify` lists the damage; restore from a backup or a replica.
 */
export class DataCorruptedError extends SessionLogError {
  constructor(message: string, options: SessionLogErrorOptions = {}) {
    super(message, { code: grpc.status.DATA_LOSS, ...options, reason: "DATA_CORRUPTED" });
    this.name = "DataCorruptedError";
  }
}

/** The start of the details of the INTERNAL status grpc-js gives a reply it could not decode. */
const UNDECODABLE_REPLY = "Response message parsing error";

/**
 * Whether a failure is this client's own failure to decode a reply (grpc-js's INTERNAL "Response
 * message parsing error: ..."), not a server's answer or the transport's end: sent again, the
 * same stored bytes fail the same way.
 */
export function undecodableReply(error: unknown): boolean {
  const failure = error as Failure | null;
  return (
    failure?.code === grpc.status.INTERNAL &&
    String(failure.details ?? "").startsWith(UNDECODABLE_REPLY) &&
    !(error instanceof SessionLogError) &&
    !errorInfo(error)
  );
}

/** An undecodable reply (see undecodableReply) as a DataCorruptedError; what: what it held. */
export function undecodable(error: unknown, what = "a reply from the server"): DataCorruptedError {
  const details = String((error as Failure | null)?.details ?? "");
  return new DataCorruptedError(
    `${what} could not be decoded: a streamed read (since(), follow()) sends the events as they ` +
      "are stored, so a damaged record reaches the client as bytes that are not an Event; run " +
      `\`sessionlog admin verify\` on the server's data folder (${details})`,
    { cause: error },
  );
}

const ERROR_CLASSES: Record<string, typeof SessionLogError> = {
  DATA_CORRUPTED: DataCorruptedError,
  NOT_PRIMARY: NotPrimaryError,
  WRONG_GROUP: WrongGroupError,
  LEADERSHIP_LOST: LeadershipLostError,
  REPLICAS_UNAVAILABLE: ReplicasUnavailableError,
};

/** A grpc-js error as a SessionLogError, of its reason's own class when it has one (anything
 * else passes through). */
export function toError(thrown: unknown): unknown {
  const error = thrown as Failure;
  if (thrown instanceof SessionLogError || typeof error?.code !== "number") return thrown;
  const info = errorInfo(error);
  const proxied = info ? null : proxyStatus(error);
  if (proxied !== null) {
    return new SessionLogError(
      `a proxy answered HTTP ${proxied} in place of a sessionlog server: the group it routes ` +
        "this call to has no primary (or no serving member) right now; try again once a " +
        `failover has elected one (${error.details || error.message})`,
      { code: grpc.status.UNAVAILABLE, reason: "UNAVAILABLE", cause: error },
    );
  }
  const oversized = info ? null : oversizedMessage(error);
  if (oversized !== null) return oversized;
  if (undecodableReply(error)) return undecodable(error);
  return errorFor(error.details || error.message || "", {
    code: error.code,
    reason: info?.reason,
    domain: info?.domain,
    metadata: info?.metadata ?? {},
    cause: error,
  });
}

/** A SessionLogError of its reason's own class when it has one (NotPrimaryError, ...). */
export function errorFor(message: string, options: SessionLogErrorOptions): SessionLogError {
  const Class = (options.reason && ERROR_CLASSES[options.reason]) || SessionLogError;
  return new Class(message, options);
}

/**
 * gRPC's own bare refusal of a message over a size limit ("Sent/Received message larger than max
 * (SIZE vs. LIMIT)"; grpc-js writes "vs" without the period) said with the setting to change: a request this client would not send
 * (its `maxMessageBytes`) or the server's transport would not read ("SERVER: ...", far over its
 * --max-message-size) is REQUEST_TOO_LARGE; a reply this client would not read,
 * RESPONSE_TOO_LARGE. Null for any other error.
 */
function oversizedMessage(error: Failure): SessionLogError | null {
  const details = String(error?.details ?? "");
  if (error?.code !== grpc.status.RESOURCE_EXHAUSTED) return null;
  const options = (reason: string, metadata: Record<string, string>): SessionLogErrorOptions => ({ code: error.code, reason, domain: "", metadata, cause: error });
  // grpc-js's own refusal to send names the limit only.
  const unsent = /Attempted to send message with a size larger than (\d+)/.exec(details);
  if (unsent) {
    return new SessionLogError(
      `the request is over this client's ${unsent[1]}-byte message limit (new ` +
        "SessionLogClient(target, { maxMessageBytes })); nothing was sent: split it into " +
        `smaller calls (the server's own limit is its --max-message-size) (${details})`,
      options("REQUEST_TOO_LARGE", { limit: unsent[1] }),
    );
  }
  const found = /(SERVER: )?(Sent|Received) message larger than max \((\d+) vs\.? (\d+)\)/.exec(details);
  if (!found) return null;
  const [, server, direction, size, limit] = found;
  const metadata: Record<string, string> = { size, limit };
  if (direction === "Sent") {
    return new SessionLogError(
      `the request is ${size} bytes, over this client's ${limit}-byte message limit ` +
        "(new SessionLogClient(target, { maxMessageBytes })); nothing was sent: split it into " +
        `smaller calls (the server's own limit is its --max-message-size) (${details})`,
      options("REQUEST_TOO_LARGE", metadata),
    );
  }
  if (server) {
    return new SessionLogError(
      `the request is ${size} bytes, far over the server's message limit (--max-message-size; ` +
        `its transport reads no request over ${limit} bytes); nothing was written: split it ` +
        `into smaller calls (${details})`,
      options("REQUEST_TOO_LARGE", metadata),
    );
  }
  return new SessionLogError(
    `the reply is ${size} bytes, over this client's ${limit}-byte message limit: raise ` +
      `{ maxMessageBytes } to the server's --max-message-size (${details})`,
    options("RESPONSE_TOO_LARGE", metadata),
  );
}

/**
 * The HTTP status (502, 503 or 504) a proxy (HAProxy) answered a call with when it had no
 * server for it, read from the details of a status without ErrorInfo ("Received HTTP status
 * code 503"; grpcio: "Received http2 header with status: 503"); null otherwise.
 */
export function proxyStatus(error: unknown): number | null {
  if (errorInfo(error)) return null;
  const found = /(?:header with status|HTTP status code):? *(\d{3})\b/.exec(String((error as Failure)?.details ?? ""));
  const status = found ? Number(found[1]) : 0;
  return [502, 503, 504].includes(status) ? status : null;
}
