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
