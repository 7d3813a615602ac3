"""Just enough of the protobuf wire format to move stored bytes without parsing them.

Events are stored as serialized ``Event`` messages. A response whose field is ``repeated Event``
is, on the wire, each event's bytes behind a tag and a length, so the server can send stored
events as they are instead of parsing and re-serializing them. Protobuf writes fields in field
number order, which is what lets :func:`with_seq` put field 1 in front of an event serialized
without it and get exactly the bytes ``SerializeToString`` would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from google.protobuf.timestamp_pb2 import Timestamp

from sessionlog.v1.event_pb2 import Event

_EVENT = {f.name: f.number for f in Event.DESCRIPTOR.fields}
_TIMESTAMP = {f.name: f.number for f in Timestamp.DESCRIPTOR.fields}
"""Field numbers by name, from the generated descriptors: no number here is copied by hand."""
VARINT = 0
LENGTH_DELIMITED = 2

_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def varint(value: int) -> bytes:
    """The base-128 varint encoding of a non-negative integer."""
    if value < 0x80:
        return _ONE_BYTE[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 0x20_0000:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    if value < 0x8_0000_0000:  # up to five bytes: times in seconds and nanos, most seqs
        if value < 0x1000_0000:
            return bytes(
                (
                    (value & 0x7F) | 0x80,
                    ((value >> 7) & 0x7F) | 0x80,
                    ((value >> 14) & 0x7F) | 0x80,
                    value >> 21,
                )
            )
        return bytes(
            (
                (value & 0x7F) | 0x80,
                ((value >> 7) & 0x7F) | 0x80,
                ((value >> 14) & 0x7F) | 0x80,
                ((value >> 21) & 0x7F) | 0x80,
                value >> 28,
            )
        )
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_tags: dict[int, bytes] = {}


def tag(field_number: int, wire_type: int) -> bytes:
    key = (field_number << 3) | wire_type
    encoded = _tags.get(key)
    if encoded is None:
        encoded = _tags[key] = varint(key)
    return encoded


_PREFIXED_LENGTHS = 1 << 14
"""Payloads shorter than this (a length varint of at most two bytes) take their tag and length
from a table built once per field number, instead of encoding both for every payload."""
_prefix_tables: dict[int, list[bytes]] = {}


def _prefix_table(field_number: int) -> list[bytes]:
    table = _prefix_tables.get(field_number)
    if table is None:
        key = tag(field_number, LENGTH_DELIMITED)
        table = _prefix_tables[field_number] = [key + varint(n) for n in range(_PREFIXED_LENGTHS)]
    return table


def length_delimited(field_number: int, payloads: Iterable[bytes]) -> bytes:
    """A repeated message (or bytes) field holding each payload in order.

    One join over prefix, payload, prefix, payload...: the hot path of Since and Append replies,
    so the per-payload work is a table lookup, not a varint encode and two concatenations.
    """
    items = payloads if isinstance(payloads, list) else list(payloads)
    if not items:
        return b""
    table = _prefix_table(field_number)
    try:
        prefixes = [table[len(p)] for p in items]
    except IndexError:  # a payload of 16 KiB or more: encode its length
        key = tag(field_number, LENGTH_DELIMITED)
        prefixes = [table[n] if n < _PREFIXED_LENGTHS else key + varint(n) for n in map(len, items)]
    parts: list[bytes] = [b""] * (2 * len(items))
    parts[::2] = prefixes
    parts[1::2] = items
    return b"".join(parts)


def uint_field(field_number: int, value: int) -> bytes:
    """A uint64 / bool field; proto3 omits zero."""
    return tag(field_number, VARINT) + varint(value) if value else b""


def packed_uints(field_number: int, values: Iterable[int]) -> bytes:
    """A packed repeated uint64 field; omitted when empty."""
    body = b"".join(varint(v) for v in values)
    return tag(field_number, LENGTH_DELIMITED) + varint(len(body)) + body if body else b""


def int_field(field_number: int, value: int) -> bytes:
    """An int64 / int32 field (negative values take ten bytes, as protobuf writes them); proto3
    omits zero."""
    return tag(field_number, VARINT) + varint(value & 0xFFFF_FFFF_FFFF_FFFF) if value else b""


def message_field(field_number: int, payload: bytes) -> bytes:
    """A set singular message field (present even when its payload is empty)."""
    return tag(field_number, LENGTH_DELIMITED) + varint(len(payload)) + payload


_MIN_TIMESTAMP_NS = -62135596800 * 1_000_000_000
_MAX_TIMESTAMP_NS = 253402300799 * 1_000_000_000 + 999_999_999
"""The range of a valid google.protobuf.Timestamp (years 0001 to 9999), in ns since the epoch."""


def event_time_field(nanoseconds: int) -> bytes:
    """An Event's ``time`` field holding this instant, as ``time.FromNanoseconds`` sets it
    (seconds floored, nanos in [0, 1e9)); b"" outside the range of a valid Timestamp.

    Built on every append: the encoded seconds are kept from the last call (they change once a
    second), so most calls encode only the nanos."""
    global _last_seconds
    if not _MIN_TIMESTAMP_NS <= nanoseconds <= _MAX_TIMESTAMP_NS:
        return b""
    seconds, nanos = divmod(nanoseconds, 1_000_000_000)
    cached, encoded = _last_seconds
    if cached != seconds:
        encoded = _SECONDS_TAG + varint(seconds & _INT64_MASK) if seconds else b""
        _last_seconds = (seconds, encoded)
    payload = encoded + _NANOS_TAG + varint(nanos) if nanos else encoded
    return _TIME_TAG + _ONE_BYTE[len(payload)] + payload  # a Timestamp is under 128 bytes


_last_seconds = (0, b"")
"""The seconds last encoded by ``event_time_field``, and their bytes (one tuple: swapped whole)."""


_TIME_TAG = tag(_EVENT["time"], LENGTH_DELIMITED)
_SECONDS_TAG = tag(_TIMESTAMP["seconds"], VARINT)
_NANOS_TAG = tag(_TIMESTAMP["nanos"], VARINT)
_INT64_MASK = 0xFFFF_FFFF_FFFF_FFFF


def timestamp(nanoseconds: int) -> bytes:
    """The serialized ``google.protobuf.Timestamp`` of an instant (seconds floored, nanos in
    [0, 1e9)), as ``FromNanoseconds`` then ``SerializeToString`` give it."""
    seconds, nanos = divmod(nanoseconds, 1_000_000_000)
    payload = _SECONDS_TAG + varint(seconds & _INT64_MASK) if seconds else b""
    return payload + _NANOS_TAG + varint(nanos) if nanos else payload


def with_time(event_without_time: bytes, event_type: int, time_field: bytes) -> bytes:
    """An event's bytes with its ``time`` field added: what ``SerializeToString`` gives for the
    same event with that time set; b"" when the bytes do not have the expected shape.

    Fields are written in number order: an event the server accepts has seq 0 (absent), so its
    bytes start with its type (a one-byte tag and, for a known type, a one-byte value), then
    data, surface_op and any unknown fields. The time (numbered right after the type) goes
    right after the type.
    """
    body = event_without_time
    if not time_field or len(body) < 2 or body[:1] != _TYPE_TAG or body[1] != event_type:
        return b""
    if not 0 < event_type < 0x80:
        return b""
    return put_time(body, time_field)


def put_time(event_without_time: bytes, time_field: bytes) -> bytes:
    """``with_time`` for bytes already known to start with a one-byte type tag and value
    (``fold.doubtful_events`` vouched for them): the time goes right after those two bytes."""
    return event_without_time[:2] + time_field + event_without_time[2:]


_TYPE_TAG = tag(_EVENT["type"], VARINT)
_DATA_TAG = tag(_EVENT["data"], LENGTH_DELIMITED)

_SEQ_TAG = tag(_EVENT["seq"], VARINT)
assert (
    _EVENT["seq"]
    < _EVENT["type"]
    < _EVENT["time"]
    < min(n for name, n in _EVENT.items() if name not in ("seq", "type", "time"))
), "with_seq and with_time rely on Event's field order: seq, type, time, then the rest"
assert len(_TYPE_TAG) == len(_DATA_TAG) == len(_SEQ_TAG) == 1
_TYPE_BYTE, _DATA_BYTE = _TYPE_TAG[0], _DATA_TAG[0]
_SEQ_LOW = [_SEQ_TAG + bytes((n | 0x80,)) for n in range(0x80)]
"""The seq tag and a seq's first varint byte (of a seq of two bytes or more), by its low 7 bits."""


def with_seq(seq: int, event_without_seq: bytes) -> bytes:
    """The stored form of an event: its bytes with ``seq`` (field 1) set."""
    return _SEQ_TAG + varint(seq) + event_without_seq if seq else event_without_seq


def with_seqs(first_seq: int, events_without_seq: Sequence[bytes]) -> list[bytes]:
    """``with_seq`` for events of consecutive seqs from ``first_seq`` on, in one pass: the seqs
    of a run of 128 share every varint byte after the first, so each event costs a table
    lookup and two concatenations rather than a varint encode."""
    out: list[bytes] = []
    seq, end = first_seq, first_seq + len(events_without_seq)
    while seq < end:
        if seq < 0x80:  # one varint byte (seq 0: no field at all)
            stop = min(end, 0x80)
            out.extend(with_seq(s, events_without_seq[s - first_seq]) for s in range(seq, stop))
        else:
            stop = min(end, (seq | 0x7F) + 1)
            high, low = varint(seq >> 7), _SEQ_LOW
            out.extend(
                low[s & 0x7F] + high + events_without_seq[s - first_seq] for s in range(seq, stop)
            )
        seq = stop
    return out


def plain_event_type(body: bytes) -> int:
    """The type of a serialized event that holds a type (below 128) and at most data besides,
    in that order and nothing else (no seq, time, surface_op, usage, state_delta, redaction or
    unknown field); 0 for any other event. What lets the writer's caller check the common
    event by its data alone (``fold.check_plain_event``) and stamp it with ``with_time``."""
    size = len(body)
    if size < 2 or body[0] != _TYPE_BYTE or body[1] >= 0x80:
        return 0
    if size == 2:
        return body[1]
    if body[2] != _DATA_BYTE or size < 4:
        return 0
    if body[3] < 0x80:  # data under 128 bytes: its length is one byte
        return body[1] if 4 + body[3] == size else 0
    try:
        length, start = _read_varint(body, 3)
    except ValueError:
        return 0
    return body[1] if start + length == size else 0


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def split_field(data: bytes, field_number: int) -> tuple[bytes, list[bytes]]:
    """Take a length-delimited field out of a serialized message without parsing the rest.

    Returns the message bytes without that field (the other fields untouched, in order) and
    the payloads of the field's occurrences, in order.
    """
    rest = bytearray()
    payloads: list[bytes] = []
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = _read_varint(data, pos)
        wire_type = key & 7
        if wire_type == 0:
            _, pos = _read_varint(data, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            length, pos = _read_varint(data, pos)
            if key >> 3 == field_number:
                payloads.append(data[pos : pos + length])
                pos += length
                continue
            pos += length
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
        if pos > len(data):
            raise ValueError("truncated field")
        rest += data[start:pos]
    return bytes(rest), payloads
