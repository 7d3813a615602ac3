"""order_by's one grammar (``listing.order``, AIP-132 with one term): ``FIELD [asc|desc]``,
ascending by default, case and extra spaces insignificant; anything else one InvalidOrderBy
naming the RPC and what it offers, for ListEvents (``paging.descending``) and ListSessions
(``usecases.listing_order``) alike."""

from __future__ import annotations

import pytest

from sessionlog import errors
from sessionlog.listing import order
from sessionlog.service import paging
from sessionlog.service.usecases import listing_order
from sessionlog.storage.records import BY_ID, BY_UPDATE

OFFERED = {("a", False): "a up", ("b", True): "b down", ("b", False): "b up"}


@pytest.mark.parametrize(
    ("text", "meant"),
    [
        ("", "a up"),  # the first offered
        ("   ", "a up"),
        ("a", "a up"),
        ("a asc", "a up"),
        ("  A   ASC  ", "a up"),
        ("b desc", "b down"),
        ("B Desc", "b down"),
        ("b", "b up"),
        ("\tb\ndesc ", "b down"),
    ],
)
def test_a_field_and_an_optional_direction(text: str, meant: str) -> None:
    """One term: a field alone is ascending; case and spaces do not matter."""
    assert order(text, OFFERED, "Rpc") == meant


@pytest.mark.parametrize(
    "text",
    ["a desc", "c", "a asc desc", "a,b", "a, b desc", "asc", "desc", "a ascending", "a-desc"],
)
def test_anything_else_is_one_invalid_order_by(text: str) -> None:
    """An order not offered, a direction not asc/desc, several terms: INVALID_ORDER_BY naming
    the RPC and listing every offered order."""
    with pytest.raises(errors.InvalidOrderBy) as refused:
        order(text, OFFERED, "Rpc")
    assert refused.value.metadata == {"order_by": text, "rpc": "Rpc"}
    assert "not offered by Rpc" in refused.value.message
    for offered in ('"a asc"', '"b desc"', '"b asc"'):
        assert offered in refused.value.message


def test_list_events_and_list_sessions_read_it_alike() -> None:
    """The two RPCs that take order_by use the one grammar, each with its own fields."""
    assert [paging.descending(t) for t in ("", "seq", "SEQ asc", "seq  desc")] == [
        False,
        False,
        False,
        True,
    ]
    assert [listing_order(t) for t in ("", "session_id", "Session_Id ASC", "update_time DESC")] == [
        BY_ID,
        BY_ID,
        BY_ID,
        BY_UPDATE,
    ]
    for rpc, read, text in (
        ("ListEvents", paging.descending, "seq sideways"),
        ("ListSessions", listing_order, "update_time"),
    ):
        with pytest.raises(errors.InvalidOrderBy) as refused:
            read(text)
        assert refused.value.metadata["rpc"] == rpc


def test_a_long_order_by_is_cut_in_the_error() -> None:
    """The error repeats at most 60 characters of what was sent."""
    with pytest.raises(errors.InvalidOrderBy) as refused:
        order("x" * 500, OFFERED, "Rpc")
    assert refused.value.metadata["order_by"] == "x" * 60
