// Values between the Node client's plain objects and the proto messages it sends: events, JSON
// as google.protobuf.Struct, times, and an Append's request and result (client.append's and
// AppendStream's). Below append-stream.ts and index.ts; it imports neither.

import { SessionLogError } from "./errors.js";
import type * as proto from "./proto.js";
import type { Input } from "./proto.js";
import type { AppendOptions, AppendResult, Event, EventTypeName, Json, JsonObject, NewEvent, Time, Usage, UsageInput } from "./types.js";

const TYPE_PREFIX = "EVENT_TYPE_";

/**
 * A value the client refuses before sending: the same typed error a server gives a request it
 * cannot read (INVALID_ARGUMENT / MALFORMED_REQUEST, metadata.field naming the argument).
 */
/** @internal */
export function refused(field: string, message: string): SessionLogError {
  return new SessionLogError(message, {
    code: 3,
    reason: "MALFORMED_REQUEST",
    domain: "sessionlog",
    metadata: { field },
  });
}

/**
 * A seq the API takes as uint64 (at_seq, expected_seq, parent_seq, a seq to redact), checked
 * before it is sent: a whole number 0 or more, or a bigint below 2^64. protobufjs would send
 * another seq in place of a negative, fractional or too large one without a word
 * (redactEvents([-1]) redacted seq 0).
 */
/** @internal */
export function checkSeq(value: number, name: string): number {
  const whole =
    typeof value === "bigint" ? value >= 0n && value < 2n ** 64n : Number.isSafeInteger(value) && value >= 0;
  if (!whole) throw refused(name, `${name} must be a whole number, 0 or more (got ${String(value)})`);
  return value;
}

/**
 * A listing's pageSize, checked before it is sent: a negative one is INVALID_PAGE_SIZE, as the
 * server refuses it (protobufjs sent -1 in an unsigned field as 4294967295, a full page), one
 * that is not a whole number MALFORMED_REQUEST, and one past the field's range the largest it
 * holds (a server caps a page far below it).
 */
/** @internal */
export function checkPageSize(value: number): number {
  if (!Number.isInteger(value)) throw refused("pageSize", `pageSize must be a whole number (got ${String(value)})`);
  if (value < 0) {
    throw new SessionLogError(`page_size must not be negative (got ${value}); 0 means the default`, {
      code: 3,
      reason: "INVALID_PAGE_SIZE",
      domain: "sessionlog",
      metadata: { page_size: String(value) },
    });
  }
  return Math.min(value, 2 ** 31 - 1);
}

/** A plain JSON value -> google.protobuf.Value as proto-loader expects it. */
function toValue(value: Json | undefined): Input<proto.Value> {
  if (value === null || value === undefined) return { nullValue: "NULL_VALUE" };
  if (typeof value === "number") return { numberValue: value };
  if (typeof value === "string") return { stringValue: value };
  if (typeof value === "boolean") return { boolValue: value };
  if (Array.isArray(value)) return { listValue: { values: value.map(toValue) } };
  if (typeof value === "object") return { structValue: toStruct(value) };
  throw new TypeError(`not a JSON value: ${String(value)}`);
}

/** A plain object -> google.protobuf.Struct. */
export function toStruct(object: JsonObject | null | undefined): Input<proto.Struct> {
  const fields: { [key: string]: Input<proto.Value> } = {};
  for (const [key, value] of Object.entries(object ?? {})) fields[key] = toValue(value);
  return { fields };
}

function fromValue(value: proto.Value | null | undefined): Json {
  if (!value) return null;
  if (value.structValue !== undefined && value.structValue !== null) return fromStruct(value.structValue);
  if (value.listValue !== undefined && value.listValue !== null) return (value.listValue.values ?? []).map(fromValue);
  if (value.stringValue !== undefined && value.stringValue !== null) return value.stringValue;
  if (value.numberValue !== undefined && value.numberValue !== null) return value.numberValue;
  if (value.boolValue !== undefined && value.boolValue !== null) return value.boolValue;
  return null;
}

/** google.protobuf.Struct -> a plain object. */
export function fromStruct(struct: proto.Struct | null | undefined): JsonObject {
  const out: JsonObject = {};
  for (const [key, value] of Object.entries(struct?.fields ?? {})) out[key] = fromValue(value);
  return out;
}

/** "2026-01-02T03:04:05.123456Z" or a Date -> google.protobuf.Timestamp, to the nanosecond. */
export function toTimestamp(time: Time | Date): { seconds: number; nanos: number } {
  if (time instanceof Date) {
    const ms = time.getTime();
    return { seconds: Math.floor(ms / 1000), nanos: (((ms % 1000) + 1000) % 1000) * 1e6 };
  }
  const match = /^(.*?)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$/.exec(String(time));
  if (!match) throw new TypeError(`not an RFC 3339 time: ${time}`);
  const ms = Date.parse(`${match[1]}${match[3]}`);
  if (Number.isNaN(ms)) throw new TypeError(`not an RFC 3339 time: ${time}`);
  return { seconds: Math.floor(ms / 1000), nanos: Number((match[2] ?? "").padEnd(9, "0")) };
}

/** google.protobuf.Timestamp -> RFC 3339 in UTC with 0, 3, 6 or 9 fraction digits (as protobuf JSON). */
export function fromTimestamp(
  stamp: { seconds?: number | null; nanos?: number | null } | null | undefined,
): Time | undefined {
  if (!stamp) return undefined;
  const seconds = Number(stamp.seconds ?? 0);
  const nanos = Number(stamp.nanos ?? 0);
  const base = new Date(seconds * 1000).toISOString().slice(0, 19);
  if (nanos === 0) return `${base}Z`;
  const digits = String(nanos).padStart(9, "0");
  const fraction = digits.endsWith("000000") ? digits.slice(0, 3) : digits.endsWith("000") ? digits.slice(0, 6) : digits;
  return `${base}.${fraction}Z`;
}

/** "user_message", "USER_MESSAGE" or "EVENT_TYPE_USER_MESSAGE" -> "EVENT_TYPE_USER_MESSAGE". */
export function eventTypeName(type: string): string {
  const upper = String(type).trim().toUpperCase();
  return upper.startsWith(TYPE_PREFIX) ? upper : TYPE_PREFIX + upper;
}

const SHORT_TYPE = (name: string): string => String(name).slice(TYPE_PREFIX.length).toLowerCase();

/**
 * An event as sent: { type, data?, replace?: [start, stop], time?, stateDelta?, usage? } -> the
 * proto object. stateDelta (an object; a null value deletes its key) is sent only when given, so an
 * event without one changes no state.
 */
export function toEvent(event: NewEvent): Input<proto.Event> {
  const out: Input<proto.Event> = { type: eventTypeName(event.type) as proto.EventType, data: toStruct(event.data ?? {}) };
  if (event.replace) {
    const [start_seq, stop_seq] = event.replace;
    out.surface_op = { replace: { start_seq, stop_seq } };
  }
  if (event.time !== undefined) out.time = toTimestamp(event.time);
  if (event.stateDelta !== undefined && event.stateDelta !== null) out.state_delta = toStruct(event.stateDelta);
  if (event.usage) out.usage = toUsage(event.usage);
  return out;
}

/** A stored event -> { seq, type: "user_message", time, data, replace?, stateDelta?, usage? }. */
export function fromEvent(raw: proto.Event): Event {
  const out: Event = {
    seq: Number(raw.seq ?? 0),
    type: SHORT_TYPE(raw.type) as EventTypeName,
    time: fromTimestamp(raw.time) as Time,
    data: fromStruct(raw.data),
  };
  const replace = raw.surface_op?.replace;
  if (replace) out.replace = [Number(replace.start_seq ?? 0), Number(replace.stop_seq ?? 0)];
  if (raw.state_delta) out.stateDelta = fromStruct(raw.state_delta);
  if (raw.usage) out.usage = { model: raw.usage.model ?? "", ...usageCounts(raw.usage) };
  if (raw.redacted) out.redacted = { time: fromTimestamp(raw.redacted.redact_time) as Time, reason: raw.redacted.reason ?? "" };
  return out;
}

/** { model, inputTokens?, outputTokens?, cachedInputTokens?, reasoningTokens? } -> the proto Usage. */
function toUsage(usage: UsageInput): Input<proto.Usage> {
  return {
    model: String(usage.model ?? ""),
    input_tokens: usage.inputTokens ?? 0,
    output_tokens: usage.outputTokens ?? 0,
    cached_input_tokens: usage.cachedInputTokens ?? 0,
    reasoning_tokens: usage.reasoningTokens ?? 0,
  };
}

/** @internal */
export function usageCounts(raw: proto.Usage | proto.ModelUsage): Omit<Usage, "model"> {
  return {
    inputTokens: Number(raw.input_tokens ?? 0),
    outputTokens: Number(raw.output_tokens ?? 0),
    cachedInputTokens: Number(raw.cached_input_tokens ?? 0),
    reasoningTokens: Number(raw.reasoning_tokens ?? 0),
  };
}

/** An AppendRequest of client.append's arguments (its requestId as given: "" or absent for none). */
/** @internal */
export function appendRequest(sessionId: string, events: NewEvent[], options: AppendOptions = {}): Input<proto.AppendRequest> {
  const { expectedSeq, requestId = "", leaseHolder = "", leaseToken = 0, lenient = false, title, expectedUid = "" } = options;
  const request: Input<proto.AppendRequest> = {
    session_id: sessionId,
    events: events.map(toEvent),
    request_id: requestId,
    lease_holder: leaseHolder,
    lease_token: leaseToken,
    lenient,
    expected_uid: expectedUid,
  };
  if (expectedSeq !== undefined && expectedSeq !== null) request.expected_seq = checkSeq(expectedSeq, "expectedSeq");
  if (title !== undefined && title !== null) request.title = title;
  return request;
}

/** What client.append resolves to, of an AppendResponse. */
/** @internal */
export function appendResult(reply: proto.AppendResponse): AppendResult {
  return {
    events: (reply.events ?? []).map(fromEvent),
    nextSeq: Number(reply.next_seq ?? 0),
    drops: (reply.drops ?? []).map((d) => ({ index: d.index, reason: d.reason, message: d.message })),
    sessionUid: reply.session_uid ?? "",
  };
}
