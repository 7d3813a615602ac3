"""The LangGraph saver's record decoding: its direct walk of an event's Struct gives exactly what
``struct_to_dict`` (protobuf's JSON mapping, whole numbers as ints) gives."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionlog_client.convert import struct_to_dict
from sessionlog_client.langgraph import _data
from sessionlog_client.v1.event_pb2 import Event

_leaves = (
    st.none()
    | st.booleans()
    | st.text(max_size=8)
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
)
_values = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


def _event(data: dict[str, Any]) -> Event:
    made = Event()
    made.data.update(data)
    return made


@pytest.mark.parametrize(
    "data",
    [
        {},
        {
            "langgraph": "writes",
            "writes": [[0, "messages", "msgpack", "AAE="], [-1, "__error__", "json", ""]],
        },
        {"n": 2.0**53, "m": 2.0**53 - 1, "half": 0.5, "neg": -3.0, "flag": False, "none": None},
        {"nested": {"a": [], "b": {}, "c": [{"d": [1.0, "x"]}]}},
    ],
)
def test_records_decode_as_struct_to_dict_does(data: dict[str, Any]) -> None:
    """Whole numbers below 2^53 come back as ints, the rest as they were, nesting kept."""
    event = _event(data)
    assert _data(event) == struct_to_dict(event.data)


@given(st.dictionaries(st.text(max_size=6), _values, max_size=5))
def test_any_data_decodes_as_struct_to_dict_does(data: dict[str, Any]) -> None:
    """For any JSON object a Struct can hold, the two decodings agree, types included."""
    event = _event(data)
    mine, reference = _data(event), struct_to_dict(event.data)
    assert mine == reference
    assert repr(mine) == repr(reference)
