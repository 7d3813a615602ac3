"""ListSessions' page tokens: what a token is bound to (``Listing``), its one format and its one
error, for the servicer that hands tokens out and takes them back and for the shard scatter that
pages through the other groups with them (``shard.scatter``), both above this module.

A token is opaque to clients and no secret. Layout, base64url without padding: one version byte
(1: an id-order listing, whose cursor is the last id's UTF-8; 2: an update-time listing, whose
cursor is its last ``recent`` key), the first 8 bytes of the SHA-256 of what the listing is bound
to (a plain listing, id order without a filter, its prefix alone), then the cursor. Fixed offsets,
so decoding needs no general parser (a JSON token let a deeply nested forgery reach the JSON
parser's recursion limit); the digest only binds the token to its listing. Anything that is not
a token of the same listing is MalformedRequest naming ``page_token``.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

from sessionlog import errors, fold
from sessionlog.storage.records import BY_ID, BY_UPDATE

PAGE_TOKEN_VERSION = 1
_PREFIX_DIGEST_BYTES = 8
_MAX_PAGE_TOKEN_CHARS = 4 * -(-(1 + _PREFIX_DIGEST_BYTES + fold.MAX_SESSION_ID_BYTES) // 3)
"""No token this server hands out is longer: anything longer is refused before decoding."""


def _prefix_digest(prefix: str) -> bytes:
    return hashlib.sha256(prefix.encode()).digest()[:_PREFIX_DIGEST_BYTES]


def encode_page_token(last_id: str, prefix: str) -> str:
    """The token of a plain listing (id order, no filter) under ``prefix`` after ``last_id``."""
    return encode_listing_token(last_id.encode(), Listing(prefix, "", BY_ID))


@dataclass(frozen=True)
class Listing:
    """What a page token is bound to: a token continues only the listing it came from."""

    prefix: str
    filter: str
    order: str

    def digest(self) -> bytes:
        if not self.filter and self.order == BY_ID:
            return _prefix_digest(self.prefix)  # the tokens of plain listings stay as they were
        bound = "\x00".join((self.prefix, self.filter, self.order))
        return hashlib.sha256(bound.encode()).digest()[:_PREFIX_DIGEST_BYTES]


ORDER_TOKEN_VERSION = 2
"""The first byte of a token of an update-time listing: its cursor is a ``recent`` key."""
_MAX_LISTING_TOKEN_CHARS = _MAX_PAGE_TOKEN_CHARS + 12


def encode_listing_token(cursor: bytes, listing: Listing) -> str:
    """The token that continues ``listing`` after ``cursor``: its last id (version 1), or for an
    update-time listing its last ``recent`` key (version 2)."""
    version = ORDER_TOKEN_VERSION if listing.order == BY_UPDATE else PAGE_TOKEN_VERSION
    payload = bytes((version,)) + listing.digest() + cursor
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


def decode_listing_token(token: str, listing: Listing) -> bytes:
    """The cursor a token continues from; MalformedRequest for anything that is not a token
    of this same listing."""
    if not token:
        return b""
    version = ORDER_TOKEN_VERSION if listing.order == BY_UPDATE else PAGE_TOKEN_VERSION
    try:
        if len(token) > _MAX_LISTING_TOKEN_CHARS:
            raise ValueError("longer than any page token")
        padded = token + "=" * (-len(token) % 4)
        payload = base64.b64decode(padded, altchars=b"-_", validate=True)
        digest = payload[1 : 1 + _PREFIX_DIGEST_BYTES]
        if payload[:1] != bytes((version,)) or digest != listing.digest():
            raise ValueError("token does not match this listing")
        cursor = payload[1 + _PREFIX_DIGEST_BYTES :]
        id_part = cursor[8:] if version == ORDER_TOKEN_VERSION else cursor
        if version == ORDER_TOKEN_VERSION and len(cursor) < 9:
            raise ValueError("no update-time cursor")
        fold.check_session_id(id_part.decode("utf-8"))
    except (ValueError, errors.InvalidSessionId):
        raise errors.MalformedRequest(
            "page_token is not a token from a previous ListSessions call with the same prefix, "
            "filter and order_by; list again from the start without one",
            field="page_token",
        ) from None
    return cursor
