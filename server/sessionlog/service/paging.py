"""Page sizes, orders and page tokens of ListEvents and of paged DeriveMessages.

A token is opaque to clients and no secret: base64url (no padding) of fixed-width fields,

    version (1 byte) | kind (1 byte) | digest (8 bytes) | fields (u64 BE each)

where the digest is the first 8 bytes of SHA-256 over the kind, the session id and its internal
id (sid, never reused), which binds a token to its session, to the listing that made it, and to
that session's life: a session deleted and written again under the same id is another log, and
a token of the first is nobody's token there. The kinds and their fields:

    ListEvents, oldest first   b"A"   the next seq to read
    ListEvents, newest first   b"D"   the seq the next page stops before (exclusive)
    DeriveMessages             b"M"   the pinned event count, the position the next page stops
                                      before, the replace generation, at_seq + 1 (0: unset),
                                      then where the walk stopped: its next seq + 1 (0: walk
                                      from the view's end again), the number of hidden ranges
                                      and of pending entries, each range's start and stop, each
                                      pending entry's seq (``fold.TailWalk``)

Fixed offsets mean decoding needs no general parser; the frame is every listing's
(``listing.seal``/``listing.unseal``), so anything that does not decode to a token of the same
kind and session is InvalidPageToken, never anything else, as in every other listing.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from sessionlog import errors, listing
from sessionlog.storage.store import Resume

VERSION = 1
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
_U64 = struct.Struct(">Q")
ASCENDING, DESCENDING, MESSAGES = b"A", b"D", b"M"
_FIELDS = {ASCENDING: 1, DESCENDING: 1, MESSAGES: 7}
"""How many u64 fields a token of each kind has (a messages token: at least this many)."""
MAX_WALK_VALUES = 64
"""A messages token carries its walk when its ranges and pending entries take at most this many
u64s; otherwise the next page walks from the view's end again."""
_ORDERS = {("seq", False): False, ("seq", True): True}


def page_size(asked: int) -> int:
    """The page size a request gets: 0 means the default, above the maximum is the maximum."""
    if asked < 0:
        raise errors.InvalidPageSize(
            f"page_size must not be negative (got {asked}); 0 means {DEFAULT_PAGE_SIZE}",
            page_size=asked,
        )
    return min(asked or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def descending(order_by: str) -> bool:
    """Whether ``order_by`` asks for newest first: "seq desc" (or oldest first: "", "seq",
    "seq asc"); anything else is InvalidOrderBy (``listing.order``)."""
    return listing.order(order_by, _ORDERS, "ListEvents")


def _digest(kind: bytes, session_id: str, sid: int) -> bytes:
    return listing.binding(
        kind, session_id.encode("utf-8", "surrogatepass"), b"\x00", _U64.pack(sid)
    )


def encode(kind: bytes, session_id: str, *fields: int, sid: int = 0) -> str:
    """A token of ``kind`` for ``session_id`` (its internal id ``sid``; 0: never written)
    carrying ``fields``."""
    body = b"".join(_U64.pack(value) for value in fields)
    return listing.seal(bytes((VERSION, kind[0])), _digest(kind, session_id, sid), body)


def decode(token: str, kind: bytes, session_id: str, rpc: str, *, sid: int = 0) -> tuple[int, ...]:
    """The fields of a token made by ``encode(kind, session_id, ..., sid=sid)``;
    InvalidPageToken for anything else: another session's (or another life's of this id),
    another order's, another RPC's, or no token at all."""
    fewest = _FIELDS[kind]
    most = fewest + (MAX_WALK_VALUES if kind == MESSAGES else 0)

    def read(body: bytes) -> tuple[int, ...]:
        count, rest = divmod(len(body), _U64.size)
        if rest or not fewest <= count <= most:
            raise ValueError("not a token's size")
        return tuple(_U64.unpack_from(body, i * _U64.size)[0] for i in range(count))

    head = bytes((VERSION, kind[0]))
    digest = _digest(kind, session_id, sid)
    again = _again(session_id)
    return listing.unseal(token, head, digest, read, longest=most * _U64.size, rpc=rpc, again=again)


def _again(session_id: str) -> str:
    return f"for session '{session_id}' with the same order and options; start again without one"


def invalid(rpc: str, session_id: str) -> errors.InvalidPageToken:
    return listing.refused(rpc, _again(session_id))


@dataclass(frozen=True)
class MessagesCursor:
    """Where the next page of a paged DeriveMessages stops, and the view it belongs to."""

    pinned: int
    """The event count the first page saw: every page folds events 0..pinned-1."""
    before: int
    """The next page holds the entries whose position is below this."""
    generation: int
    """The replace generation the first page reported (0 with at_seq)."""
    at_seq: int | None
    walk: Resume | None = None
    """Where the walk stopped, when small enough to carry (None: walk from the end again)."""

    def encode(self, session_id: str, sid: int = 0) -> str:
        at = 0 if self.at_seq is None else self.at_seq + 1
        walk = (
            self.walk if self.walk is not None and _values(self.walk) <= MAX_WALK_VALUES else None
        )
        head = (self.pinned, self.before, self.generation, at)
        if walk is None:
            return encode(MESSAGES, session_id, *head, 0, 0, 0, sid=sid)
        ranges = [value for pair in walk.hidden for value in pair]
        counts = (walk.next_seq + 1, len(walk.hidden), len(walk.pending))
        return encode(MESSAGES, session_id, *head, *counts, *ranges, *walk.pending, sid=sid)

    @classmethod
    def decode(
        cls, token: str, session_id: str, at_seq: int | None, sid: int = 0
    ) -> MessagesCursor:
        """The cursor in ``token``; InvalidPageToken also when ``at_seq`` differs from the
        first page's, or the walk it carries does not hold together."""
        fields = decode(token, MESSAGES, session_id, "DeriveMessages", sid=sid)
        pinned, before, generation, at, resume, ranges, pending = fields[:7]
        cursor = cls(pinned, before, generation, None if at == 0 else at - 1)
        if cursor.at_seq != at_seq or (at_seq is not None and pinned != at_seq + 1):
            raise errors.InvalidPageToken(
                "page_token was made with another at_seq; send the first page's at_seq with it, "
                "or start again without a token",
                field="page_token",
            )
        values = fields[7:]
        if len(values) != 2 * ranges + pending or (resume == 0 and values):
            raise invalid("DeriveMessages", session_id)
        if resume == 0:
            return cursor
        next_seq = resume - 1
        hidden = tuple(zip(values[: 2 * ranges : 2], values[1 : 2 * ranges : 2], strict=True))
        seqs = values[2 * ranges :]
        if (
            next_seq > pinned
            or any(not start <= stop < next_seq for start, stop in hidden)
            or any(not next_seq <= seq < pinned for seq in seqs)
            or len(set(seqs)) != len(seqs)
        ):
            raise invalid("DeriveMessages", session_id)
        return cls(pinned, before, generation, cursor.at_seq, Resume(next_seq, hidden, seqs))


def _values(walk: Resume) -> int:
    """The u64s a walk takes in a token."""
    return 2 * len(walk.hidden) + len(walk.pending)
