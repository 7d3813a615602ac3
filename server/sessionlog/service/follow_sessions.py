"""FollowSessions: one stream of the events of every session under a prefix or matching a filter.

    request ─▶ start position (after_position, the feed's end, or its first position)
            ─▶ follow(FEED_KEY): read the feed past the cursor, keep the followed changes
                                 (``storage.following``), send them with the position read to

The stream rides the change feed, so it is resumable by position and sees every kind of write
in commit order, on a primary, a replica (which stores the same feed) and every worker of one
server (each worker's doorbell wakes FEED_KEY for the commits of the others). A walk that finds
nothing to send does not send: it remembers how far it read (``Walk.skipped``), and the next
heartbeat carries that position, so an idle filtered stream still advances its client's cursor.

Every response carries the fingerprint of the change at its position (``position_checksum``, the
chained checksum a replica checks), and a resume that sends it back (``after_checksum``) is
refused with HISTORY_DIVERGED when this store's change there differs or is missing: a position
alone cannot tell a server restored from an older backup and written since from the one the
follower read, and would resume in the middle of a new history, skipping what came before it.
A promoted replica holds the same records, so its followers resume on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from sessionlog import errors
from sessionlog.records import Filter
from sessionlog.service.follow import Refuse, follow
from sessionlog.service.notifier import Notifier
from sessionlog.storage.changes import FEED_KEY
from sessionlog.storage.following import encode_response
from sessionlog.storage.store import Store
from sessionlog.v1 import session_log_service_pb2 as pb

MAX_RECORDS_PER_READ = 2_000
"""Feed records one read walks at most: bounds the time one read holds the event loop."""


def start_position(store: Store, request: pb.FollowSessionsRequest) -> int:
    """The first feed position the stream reads; the cursor errors name what is wrong."""
    oldest, head = store.feed_bounds()
    after = request.after_position
    if request.from_start:
        if after:
            raise errors.MalformedRequest(
                "set after_position or from_start, not both",
                field="from_start",
            )
        return 1
    if not after:
        return head + 1
    if after > head:
        raise errors.FeedPositionAhead(
            f"position {after} is past the end of this server's change feed ({head}): resume "
            "from a position this server sent, or wait for this replica to catch up",
            after_position=after,
            head_position=head,
        )
    if after + 1 < oldest:
        raise errors.FeedPositionGone(
            f"this store's change feed begins at position {oldest}, so the changes after "
            f"position {after} cannot all be streamed: follow from_start, and read each "
            "session's earlier events with Since",
            after_position=after,
            first_position=oldest,
        )
    if request.after_checksum and not store.holds_feed_at(after, request.after_checksum):
        raise errors.HistoryDiverged(
            f"this server's change at position {after} is not the one your stream read there: "
            "its history is not the one you followed (a server restored from an older backup "
            "and written since, or another store), so resuming by position would skip or repeat "
            "changes. Resume from a position this server sent, or from_start (or 0 for only "
            "new changes)",
            after_position=after,
            head_position=head,
        )
    return after + 1


@dataclass
class Walk:
    """What one stream has read: what it sent (the follow loop's cursor) or skipped past."""

    skipped: int = 0
    """The position after the last record a read walked without finding anything to send."""
    checksum: bytes = b""
    """The fingerprint of the record at ``skipped - 1`` (empty at position 0)."""


async def follow_sessions(
    refuse: Refuse,
    store: Store,
    notifier: Notifier,
    *,
    start: int,
    admits: Callable[[str], bool],
    query: Filter,
    heartbeat_seconds: float,
    max_bytes: int,
    pace: Callable[[], float] = lambda: 0.0,
) -> AsyncIterator[tuple[bytes, int]]:
    """The responses of one FollowSessions stream from feed position ``start``, each with the
    position the client resumes after once it has it."""
    known = store.checksum_at(start - 1) if start > 1 else None
    walk = Walk(skipped=start, checksum=known or b"")

    def read(cursor: int) -> tuple[bytes, int, bool]:
        begin = max(cursor, walk.skipped)
        found = store.read_followed(
            begin, admits, query, max_records=MAX_RECORDS_PER_READ, max_bytes=max_bytes
        )
        if found.changes or found.more:
            # A read stopped at a limit answers even when it found nothing, so that the loop
            # reads on at once (with a response that advances the position).
            walk.skipped, walk.checksum = found.last + 1, found.checksum
            response = encode_response(found.changes, found.last, found.checksum)
            return response, found.last + 1 - cursor, found.more
        if found.last + 1 > walk.skipped:
            walk.skipped, walk.checksum = found.last + 1, found.checksum
        return b"", 0, False

    def marker(caught_up: bool) -> bytes:
        return encode_response(
            [],
            walk.skipped - 1,
            walk.checksum,
            caught_up=caught_up,
            heartbeat=not caught_up,
        )

    stream = follow(
        refuse,
        notifier,
        key=FEED_KEY,
        subject="the followed sessions",
        cursor=start,
        live=True,
        heartbeat_seconds=heartbeat_seconds,
        read=read,
        marker=marker,
        pace=pace,
    )
    async for response, cursor in stream:
        yield response, cursor - 1
