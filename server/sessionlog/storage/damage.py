"""Damage found while reading stored records becomes DATA_CORRUPTED, never INTERNAL.

LMDB keeps no checksums of its own: a damaged page shows up either as LMDB refusing a page
(``CorruptedError``: the page is of the wrong kind; ``PageNotFoundError``: a page number past the
end; ``BadValsizeError``) or as a value that no longer decodes as the record it should be. Every
read path that turns stored bytes into records runs inside :func:`reading`, which turns both into
:class:`~sessionlog.errors.DataCorrupted` naming what could not be read (a session id, a seq, a
change position: never event data) and pointing at ``sessionlog admin verify``.

Nothing is guessed or repaired: the caller's read (or write) fails whole, and every other
session keeps working. A write that meets damage writes nothing (the writer aborts its
transaction).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import lmdb
from google.protobuf.message import DecodeError

from sessionlog import errors
from sessionlog.v1.event_pb2 import Event

LMDB_DAMAGE: tuple[type[Exception], ...] = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.BadValsizeError,
    lmdb.BadTxnError,
)
"""What LMDB raises when a page it reached is not what the tree says it should be (and, once a
read transaction has met such a page, on its next call: BadTxnError)."""

UNDECODABLE: tuple[type[Exception], ...] = (
    DecodeError,
    ValueError,  # JSON, UTF-8, an unknown record format
    TypeError,  # a JSON record with the wrong fields
    KeyError,
    struct.error,
    RecursionError,
)
"""What decoding a damaged record raises (protobuf, JSON, packed binary)."""

DAMAGE = LMDB_DAMAGE + UNDECODABLE

VERIFY_HINT = "run `sessionlog admin verify` to list the damage, then restore from a backup"


def corrupted(
    what: str, exc: BaseException, *, failed: str = "could not be read", **metadata: Any
) -> errors.DataCorrupted:
    """The DataCorrupted for ``what`` (e.g. "event 12 of session 'abc'"); the cause is named by
    its kind only, since a decoder's message may quote the damaged bytes."""
    kind = _kind(exc)
    return errors.DataCorrupted(
        f"{what} {failed}: the data file is damaged ({kind}); {VERIFY_HINT}",
        kind=kind,
        **metadata,
    )


def _kind(exc: BaseException) -> str:
    if isinstance(exc, lmdb.Error):
        return f"LMDB: {type(exc).__name__}"
    return f"undecodable record: {type(exc).__name__}"


class reading:  # lower case: it reads as the call it stands for, ``with reading(...)``
    """Run a read of ``what``; damage found inside it raises DataCorrupted instead.

    Keep the block to reads and decodes of stored records: any ValueError or TypeError in it is
    taken for damage. A class rather than a generator: it is entered on every read, and this
    costs less than half as much.
    """

    __slots__ = ("metadata", "what")

    def __init__(self, what: str, **metadata: Any) -> None:
        self.what = what
        self.metadata = metadata

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None or isinstance(exc, errors.DataCorrupted) or not isinstance(exc, DAMAGE):
            return  # nothing, or not damage: the exception (if any) goes on as it was
        raise corrupted(self.what, exc, **self.metadata) from None


def decode_events(raws: Sequence[bytes], first_seq: int, session_id: str) -> list[Event]:
    """Stored events with seqs first_seq, first_seq + 1, ...; DataCorrupted naming the first
    one that does not decode, or whose seq is not the one its key says."""
    try:
        events = [Event.FromString(raw) for raw in raws]
    except UNDECODABLE:
        events = []
    if len(events) == len(raws) and all(
        event.seq == seq for seq, event in enumerate(events, first_seq)
    ):
        return events
    for seq, raw in enumerate(raws, first_seq):
        decode_event(raw, seq, session_id)
    raise AssertionError("unreachable: some event failed above")  # pragma: no cover


def decode_event(raw: bytes, seq: int, session_id: str) -> Event:
    """One stored event, which must carry the seq of its key."""
    what = f"event {seq} of session '{session_id}'"
    with reading(what, session_id=session_id, seq=seq):
        event = Event.FromString(raw)
    if event.seq != seq:
        raise errors.DataCorrupted(
            f"{what} could not be read: the data file is damaged (the record holds seq "
            f"{event.seq}); {VERIFY_HINT}",
            kind="seq mismatch",
            session_id=session_id,
            seq=seq,
        )
    return event


def missing_events(session_id: str, found: int, wanted: int) -> errors.DataCorrupted:
    """A session whose record counts more events than its log holds (seqs must be dense)."""
    return errors.DataCorrupted(
        f"events {found} to {wanted - 1} of session '{session_id}' are missing: the data file "
        f"is damaged; {VERIFY_HINT}",
        kind="missing events",
        session_id=session_id,
        seq=found,
    )
