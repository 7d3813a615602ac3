"""Just enough of the protobuf wire format to move stored bytes without parsing them.

Events are stored as serialized ``Event`` messages. A response whose field is ``repeated Event``
is, on the wire, each event's bytes behind a tag and a length, so the server can send stored
events as they are instead of parsing and re-serializing them. Protobuf writes fields in field
number order, which is what lets :func:`with_seq` put field 1 in front of an event serialized
without it and get exactly the bytes ``SerializeToString`` would.
"""

from __future__ import annotations

from collections.abc import Iterable


def varint(value: int) -> bytes:
    """The base-128 varint encoding of a non-negative integer."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(field_number: int, wire_type: int) -> bytes:
    return varint((field_number << 3) | wire_type)


def length_delimited(field_number: int, payloads: Iterable[bytes]) -> bytes:
    """A repeated message (or bytes) field holding each payload in order."""
    prefix = tag(field_number, 2)
    return b"".join(prefix + varint(len(p)) + p for p in payloads)


def uint_field(field_number: int, value: int) -> bytes:
    """A uint64 / bool field; proto3 omits zero."""
    return tag(field_number, 0) + varint(value) if value else b""


def packed_uints(field_number: int, values: Iterable[int]) -> bytes:
    """A packed repeated uint64 field; omitted when empty."""
    body = b"".join(varint(v) for v in values)
    return tag(field_number, 2) + varint(len(body)) + body if body else b""


_SEQ_TAG = tag(1, 0)


def with_seq(seq: int, event_without_seq: bytes) -> bytes:
    """The stored form of an event: its bytes with ``seq`` (field 1) set."""
    return _SEQ_TAG + varint(seq) + event_without_seq if seq else event_without_seq
