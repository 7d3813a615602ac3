"""A server's own page of sessions (its group's, each with its usage): what the listing use case
(``service.usecases``, for ListSessions and the web console) reads here, and the page a
sharded listing gathers from every group (``shard.scatter``)."""

from __future__ import annotations

from collections.abc import Sequence

from sessionlog import errors
from sessionlog.listing import Listing
from sessionlog.records import Filter
from sessionlog.service import ledger
from sessionlog.service.convert import session_message
from sessionlog.shard.ownership import Ownership
from sessionlog.storage.records import BY_ID
from sessionlog.storage.store import Store
from sessionlog.v1 import session_log_service_pb2 as pb


def local_page(
    store: Store,
    ownership: Ownership,
    after: bytes,
    listing: Listing,
    query: Filter,
    size: int,
    with_state: bool = False,
    message_limit: int | None = None,
) -> tuple[list[pb.Session], bytes]:
    """This server's own sessions of the next page, and the cursor it ends at (b"": last);
    ``with_state``: each with its state (``Session.state``, SESSION_VIEW_FULL), from the same
    memoized fold GetState reads. With ``message_limit`` (--max-message-size), the page ends
    early at the last session that still fits in a reply (``fitting``), and its cursor is that
    session's: the states of the sessions after it are not folded."""
    page, more = store.list_records(
        after=after, prefix=listing.prefix, query=query, order=listing.order, limit=size
    )
    owns = ownership.owns
    owned = [v for v in page if owns(v.session_id)]
    sessions = [session_message(v.session_id, v.meta, v.lease, v.record) for v in owned]
    spent = store.usage_of([s.session_id for s in sessions if s.exists])
    used = 0
    for index, session in enumerate(sessions):
        session.usage.extend(ledger.model_usages(spent.get(session.session_id, {})))
        if with_state and session.exists:
            session.state.CopyFrom(store.state(session.session_id)[0])
        used += listed_bytes(session)
        if message_limit is not None and used > message_limit - PAGE_FRAMING_BYTES:
            kept = fitting(sessions[: index + 1], message_limit)
            return sessions[:kept], owned[kept - 1].cursor
    return sessions, page[-1].cursor if more else b""


PAGE_FRAMING_BYTES = 1024
"""Room in a ListSessions reply for what is not a session: its next_page_token (under 400
bytes) and the usage_total fields' own framing."""
LISTED_OVERHEAD = 6
"""The bytes a repeated message field adds to each item: its tag and its length (< 2 GiB)."""


def listed_bytes(session: pb.Session) -> int:
    """At most what ``session`` adds to a ListSessions reply: its own item, and as much again
    as its usage, which the page's usage_total sums per model (a sum of usages is never longer
    than its terms: each total's varint is at most one byte longer than its longest term)."""
    usage = sum(u.ByteSize() + LISTED_OVERHEAD for u in session.usage)
    return session.ByteSize() + LISTED_OVERHEAD + usage


def fitting(sessions: Sequence[pb.Session], message_limit: int) -> int:
    """How many of ``sessions``, from the first, fit in a ListSessions reply of at most
    ``message_limit`` bytes (``listed_bytes`` each, beside ``PAGE_FRAMING_BYTES``). A page
    may hold fewer than its page_size (AIP-158), but at least one session: a first one that
    alone cannot fit is ResponseTooLarge."""
    room = message_limit - PAGE_FRAMING_BYTES
    used = 0
    for count, session in enumerate(sessions):
        used += listed_bytes(session)
        if used > room:
            if count == 0:
                raise too_large(session, used, message_limit)
            return count
    return len(sessions)


def too_large(session: pb.Session, size: int, message_limit: int) -> errors.ResponseTooLarge:
    """The error of a session that alone cannot fit in a ListSessions reply."""
    return errors.ResponseTooLarge(
        f"session '{session.session_id}' alone takes {size} bytes of a listing's reply, more "
        f"than fits under the {message_limit}-byte message limit; list it without its state "
        "(SESSION_VIEW_BASIC), or raise the server's --max-message-size",
        size=size,
        limit=message_limit,
    )


def local_sessions(
    store: Store,
    ownership: Ownership,
    after: str,
    prefix: str,
    size: int,
    query: Filter | None = None,
    filter_text: str = "",
    with_state: bool = False,
    message_limit: int | None = None,
) -> tuple[list[pb.Session], str]:
    """This server's own sessions among the next ``size`` of its store after ``after`` in
    id order (those of its group: not a copy of a slot on the move), and the id the next
    page starts after ("" when none follows); within ``message_limit`` as ``local_page``."""
    listing = Listing(prefix, filter_text, BY_ID)
    found = Filter() if query is None else query
    sessions, cursor = local_page(
        store, ownership, after.encode(), listing, found, size, with_state, message_limit
    )
    return sessions, cursor.decode()
