"""ListSessions' page tokens (``sessionlog.listing``): one format for every listing, whose plain
tokens are the bytes older servers handed out, and one error for anything else."""

from __future__ import annotations

import base64
import hashlib

import pytest

from sessionlog import errors
from sessionlog.listing import (
    Listing,
    decode_listing_token,
    encode_listing_token,
    encode_page_token,
)
from sessionlog.storage.records import BY_ID, BY_UPDATE


def test_a_plain_token_is_the_format_older_servers_handed_out() -> None:
    """Id order without a filter: version 1, SHA-256(prefix)[:8], the last id (base64url)."""
    payload = b"\x01" + hashlib.sha256(b"tenant-a.").digest()[:8] + b"tenant-a.05"
    older = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    assert encode_page_token("tenant-a.05", "tenant-a.") == older
    plain = Listing("tenant-a.", "", BY_ID)
    assert encode_listing_token(b"tenant-a.05", plain) == older
    assert decode_listing_token(older, plain) == b"tenant-a.05"


def test_every_listing_round_trips_its_own_cursor() -> None:
    """A filtered or update-time listing gets back the cursor it put in its token."""
    recent = (123).to_bytes(8, "big") + b"s1"
    for listing, cursor in (
        (Listing("", "status = 'open'", BY_ID), b"s1"),
        (Listing("p.", "", BY_UPDATE), recent),
    ):
        assert decode_listing_token(encode_listing_token(cursor, listing), listing) == cursor
    assert decode_listing_token("", Listing("", "", BY_ID)) == b""


@pytest.mark.parametrize(
    ("token", "listing"),
    [
        (encode_page_token("a.1", "a."), Listing("b.", "", BY_ID)),  # another prefix
        (encode_page_token("a.1", "a."), Listing("a.", "owner = 'x'", BY_ID)),  # another filter
        (encode_page_token("a.1", "a."), Listing("a.", "", BY_UPDATE)),  # another order
        ("%%%", Listing("", "", BY_ID)),
        ("A" * 10_000, Listing("", "", BY_ID)),
    ],
)
def test_anything_else_is_one_invalid_page_token(token: str, listing: Listing) -> None:
    """A token of another listing, or no token at all, is InvalidPageToken naming page_token."""
    with pytest.raises(errors.InvalidPageToken, match=r"^page_token is not a token") as raised:
        decode_listing_token(token, listing)
    assert raised.value.metadata == {"field": "page_token", "rpc": "ListSessions"}
