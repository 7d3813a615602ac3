"""A server's own page of sessions (its group's, each with its usage): what the listing use case
(``service.usecases``, for ListSessions and the web console) reads here, and the page a
sharded listing gathers from every group (``shard.scatter``)."""

from __future__ import annotations

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
) -> tuple[list[pb.Session], bytes]:
    """This server's own sessions of the next page, and the cursor it ends at (b"": last);
    ``with_state``: each with its state (``Session.state``, SESSION_VIEW_FULL), from the same
    memoized fold GetState reads."""
    page, more = store.list_records(
        after=after, prefix=listing.prefix, query=query, order=listing.order, limit=size
    )
    owns = ownership.owns
    sessions = [
        session_message(v.session_id, v.meta, v.lease, v.record) for v in page if owns(v.session_id)
    ]
    spent = store.usage_of([s.session_id for s in sessions if s.exists])
    for session in sessions:
        session.usage.extend(ledger.model_usages(spent.get(session.session_id, {})))
        if with_state and session.exists:
            session.state.CopyFrom(store.state(session.session_id)[0])
    return sessions, page[-1].cursor if more else b""


def local_sessions(
    store: Store,
    ownership: Ownership,
    after: str,
    prefix: str,
    size: int,
    query: Filter | None = None,
    filter_text: str = "",
    with_state: bool = False,
) -> tuple[list[pb.Session], str]:
    """This server's own sessions among the next ``size`` of its store after ``after`` in
    id order (those of its group: not a copy of a slot on the move), and the id the next
    page starts after ("" when none follows)."""
    listing = Listing(prefix, filter_text, BY_ID)
    sessions, cursor = local_page(
        store, ownership, after.encode(), listing, query or Filter(), size, with_state
    )
    return sessions, cursor.decode()
