"""The hand-written protobuf encoding gives the bytes protobuf itself gives."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionlog import wire
from sessionlog.v1 import replication_service_pb2 as rpb

EDGES = [0, 1, 0x7F, 0x80, 0x3FFF, 0x4000, 0x1F_FFFF, 0x20_0000, 0xFFF_FFFF, 0x1000_0000]
EDGES += [0x7_FFFF_FFFF, 0x8_0000_0000, 2**63, 2**64 - 1]


@pytest.mark.parametrize("value", EDGES)
def test_varint_edges_match_protobuf(value: int) -> None:
    assert wire.uint_field(1, value) == rpb.Change(position=value).SerializeToString()


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_varint_matches_protobuf(value: int) -> None:
    assert wire.uint_field(1, value) == rpb.Change(position=value).SerializeToString()


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_int_field_matches_protobuf(value: int) -> None:
    """Negative int64 values take ten bytes, as protobuf writes them."""
    from google.protobuf.timestamp_pb2 import Timestamp

    assert wire.int_field(1, value) == Timestamp(seconds=value).SerializeToString()


@given(st.integers(min_value=-62135596800 * 10**9, max_value=253402300799 * 10**9 + 999_999_999))
def test_timestamp_matches_protobuf(nanoseconds: int) -> None:
    from google.protobuf.timestamp_pb2 import Timestamp

    expected = Timestamp()
    expected.FromNanoseconds(nanoseconds)
    assert wire.timestamp(nanoseconds) == expected.SerializeToString()


MIN_NS, MAX_NS = -62135596800 * 10**9, 253402300799 * 10**9 + 999_999_999
"""The instants a Timestamp can hold (years 0001 to 9999), in ns."""


@given(st.lists(st.tuples(st.integers(MIN_NS, MAX_NS - 3), st.integers(0, 3)), max_size=8))
def test_event_time_field_matches_protobuf_call_after_call(instants: list[tuple[int, int]]) -> None:
    """The time field is an Event's serialized ``time``, whatever the call before it encoded
    (the same second again, a nanosecond on, or another instant: the seconds are kept)."""
    from sessionlog.v1.event_pb2 import Event

    for base, step in instants:
        for nanoseconds in (base, base + step):
            expected = Event()
            expected.time.FromNanoseconds(nanoseconds)
            assert wire.event_time_field(nanoseconds) == expected.SerializeToString()


def test_event_time_field_is_empty_outside_a_timestamp() -> None:
    """Instants no Timestamp can hold give no field (the reference path stamps those)."""
    assert wire.event_time_field(MIN_NS - 1) == b""
    assert wire.event_time_field(MAX_NS + 1) == b""
