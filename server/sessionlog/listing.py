"""Every listing's page tokens and ``order_by``: one frame and one error for all of them.

Every page token this server hands out (ListSessions, ListLeaseAudit, ListEvents, paged
DeriveMessages) is base64url without padding of ``head | digest (8 bytes) | body``: a head of
one or two bytes (a version, a kind) that says what the body holds, the first 8 bytes of a
SHA-256 over what the token is bound to (a prefix, a session and its life, the listing's
options), then the cursor. ``seal`` makes one and ``unseal`` takes one back; anything that does
not unseal to a token of the same head and binding, or whose body the listing cannot read, is
INVALID_PAGE_TOKEN naming ``page_token``, whichever RPC it was sent to.

``order_by`` follows AIP-132 with one term: ``FIELD [asc|desc]``, ascending by default, spaces
around and between the words insignificant, field and direction matched without regard to
case. ``order`` reads it against what an RPC offers; anything else (another field, another
direction, several terms) is INVALID_ORDER_BY, whichever RPC it was sent to.

This module also holds ListSessions' own token: what it is bound to (``Listing``), for the
servicer that hands tokens out and takes them back and for the shard scatter that pages through
the other groups with them (``shard.scatter``), both above this module.

A token is opaque to clients and no secret. Layout, base64url without padding: one version byte
(1: an id-order listing, whose cursor is the last id's UTF-8; 2: an update-time listing, whose
cursor is its last ``recent`` key), the first 8 bytes of the SHA-256 of what the listing is bound
to (a plain listing, id order without a filter, its prefix alone), then the cursor. Fixed offsets,
so decoding needs no general parser (a JSON token let a deeply nested forgery reach the JSON
parser's recursion limit); the digest only binds the token to its listing. Anything that is not
a token of the same listing is InvalidPageToken naming ``page_token``.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from sessionlog import errors, fold
from sessionlog.storage.records import BY_ID, BY_UPDATE

T = TypeVar("T")
DIGEST_BYTES = 8
"""The bytes of a token's binding digest."""


def binding(*parts: bytes) -> bytes:
    """The digest that binds a token to ``parts`` (the first 8 bytes of their SHA-256)."""
    return hashlib.sha256(b"".join(parts)).digest()[:DIGEST_BYTES]


def seal(head: bytes, digest: bytes, body: bytes) -> str:
    """The token ``head | digest | body``, base64url without padding."""
    return base64.urlsafe_b64encode(head + digest + body).decode().rstrip("=")


def refused(rpc: str, again: str) -> errors.InvalidPageToken:
    """The one error of a page token that is not one: ``again`` says how to start over."""
    return errors.InvalidPageToken(
        f"page_token is not a token from a previous {rpc} call {again}",
        field="page_token",
        rpc=rpc,
    )


def unseal(
    token: str,
    head: bytes,
    digest: bytes,
    read: Callable[[bytes], T],
    *,
    longest: int,
    rpc: str,
    again: str,
) -> T:
    """What ``read`` makes of the body of a token sealed with ``head`` and ``digest``; a body
    longer than ``longest`` bytes, a token of another head or binding, or a body ``read``
    refuses (ValueError, an invalid session id) is InvalidPageToken (``refused``)."""
    most = len(head) + DIGEST_BYTES + longest
    try:
        if len(token) > 4 * -(-most // 3):
            raise ValueError("longer than any page token")
        payload = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        if payload[: len(head)] != head or payload[len(head) : len(head) + DIGEST_BYTES] != digest:
            raise ValueError("not this listing's token")
        return read(payload[len(head) + DIGEST_BYTES :])
    except (ValueError, errors.InvalidSessionId):
        raise refused(rpc, again) from None


ASCENDING_WORD, DESCENDING_WORD = "asc", "desc"


def order(order_by: str, offered: Mapping[tuple[str, bool], T], rpc: str) -> T:
    """What ``offered`` maps the (field, descending) that ``order_by`` names to; "" is the
    first entry of ``offered``. InvalidOrderBy, listing what is offered, for anything else."""
    words = order_by.lower().split()
    if not words:
        return next(iter(offered.values()))
    named: tuple[str, bool] | None = None
    if len(words) == 1 and "," not in words[0]:
        named = (words[0], False)
    elif len(words) == 2 and words[1] in (ASCENDING_WORD, DESCENDING_WORD):
        named = (words[0], words[1] == DESCENDING_WORD)
    if named is not None and named in offered:
        return offered[named]
    choices = ", ".join(
        f'"{field} {DESCENDING_WORD if desc else ASCENDING_WORD}"' for field, desc in offered
    )
    raise errors.InvalidOrderBy(
        f"order_by {order_by[:60]!r} is not offered by {rpc}; use one of {choices} "
        f'(a field alone is ascending; "" is the first)',
        order_by=order_by[:60],
        rpc=rpc,
    )


PAGE_TOKEN_VERSION = 1
_PREFIX_DIGEST_BYTES = DIGEST_BYTES


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
_MAX_LISTING_TOKEN_BYTES = 8 + fold.MAX_SESSION_ID_BYTES
"""The longest cursor a ListSessions token carries: an update time and a session id."""


def encode_listing_token(cursor: bytes, listing: Listing) -> str:
    """The token that continues ``listing`` after ``cursor``: its last id (version 1), or for an
    update-time listing its last ``recent`` key (version 2)."""
    version = ORDER_TOKEN_VERSION if listing.order == BY_UPDATE else PAGE_TOKEN_VERSION
    return seal(bytes((version,)), listing.digest(), cursor)


def decode_listing_token(token: str, listing: Listing) -> bytes:
    """The cursor a token continues from; InvalidPageToken for anything that is not a token
    of this same listing."""
    if not token:
        return b""
    version = ORDER_TOKEN_VERSION if listing.order == BY_UPDATE else PAGE_TOKEN_VERSION

    def read(cursor: bytes) -> bytes:
        id_part = cursor[8:] if version == ORDER_TOKEN_VERSION else cursor
        if version == ORDER_TOKEN_VERSION and len(cursor) < 9:
            raise ValueError("no update-time cursor")
        fold.check_session_id(id_part.decode("utf-8"))
        return cursor

    return unseal(
        token,
        bytes((version,)),
        listing.digest(),
        read,
        longest=_MAX_LISTING_TOKEN_BYTES,
        rpc="ListSessions",
        again="with the same prefix, filter and order_by; list again from the start without one",
    )
