"""Page tokens of ListEvents and paged DeriveMessages: round trips, and every misuse refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sessionlog import errors
from sessionlog.service import paging
from sessionlog.service.paging import MessagesCursor
from sessionlog.storage.store import Resume


def test_cursors_round_trip_with_and_without_their_walk() -> None:
    """A messages cursor comes back as it went, its walk too; a walk too large to carry is left
    out (the next page then walks from the end)."""
    walk = Resume(50, ((0, 9), (20, 30)), (55, 60))
    cursor = MessagesCursor(100, 40, 3, None, walk)
    assert MessagesCursor.decode(cursor.encode("s"), "s", None) == cursor
    plain = MessagesCursor(100, 40, 3, 99)
    assert MessagesCursor.decode(plain.encode("s"), "s", 99) == plain
    huge = Resume(50, (), tuple(range(50, 50 + paging.MAX_WALK_VALUES + 1)))
    dropped = MessagesCursor.decode(MessagesCursor(200, 40, 0, None, huge).encode("s"), "s", None)
    assert dropped.walk is None
    assert paging.decode(paging.encode(paging.DESCENDING, "s", 7), paging.DESCENDING, "s", "x") == (
        7,
    )


@pytest.mark.parametrize(
    "walk",
    [
        Resume(101, (), ()),  # resumes past the pinned end
        Resume(50, ((9, 0),), ()),  # a range backwards
        Resume(50, ((0, 50),), ()),  # a range reaching the unread seqs' end
        Resume(50, (), (49,)),  # a leftover among the unread seqs
        Resume(50, (), (100,)),  # a leftover past the view
        Resume(50, (), (60, 60)),  # a leftover twice
    ],
)
def test_a_walk_that_does_not_hold_together_is_refused(walk: Resume) -> None:
    """A token forged in the right layout but with an impossible walk is INVALID_PAGE_TOKEN."""
    token = MessagesCursor(100, 40, 0, None, walk).encode("s")
    with pytest.raises(errors.InvalidPageToken):
        MessagesCursor.decode(token, "s", None)


def test_tokens_are_bound_to_session_order_rpc_and_at_seq() -> None:
    """Another session's, another kind's, another at_seq's, cut, padded or junk: refused."""
    messages = MessagesCursor(10, 4, 0, 9).encode("s")
    events = paging.encode(paging.DESCENDING, "s", 3)
    refused: list[Callable[[], object]] = [
        lambda: MessagesCursor.decode(messages, "t", 9),
        lambda: MessagesCursor.decode(messages, "s", None),
        lambda: MessagesCursor.decode(messages, "s", 8),
        lambda: MessagesCursor.decode(events, "s", None),
        lambda: paging.decode(events, paging.ASCENDING, "s", "ListEvents"),
        lambda: paging.decode(events[:-3], paging.DESCENDING, "s", "ListEvents"),
        lambda: paging.decode(events + "AAAAAAAAAAA", paging.DESCENDING, "s", "ListEvents"),
        lambda: paging.decode("ü" * 10, paging.DESCENDING, "s", "ListEvents"),
        lambda: paging.decode("A" * 5000, paging.DESCENDING, "s", "ListEvents"),
    ]
    for call in refused:
        with pytest.raises(errors.InvalidPageToken):
            call()


def test_page_sizes_and_orders() -> None:
    assert [paging.page_size(n) for n in (0, 1, 1000, 1001)] == [100, 1, 1000, 1000]
    with pytest.raises(errors.InvalidPageSize):
        paging.page_size(-1)
    assert [paging.descending(o) for o in ("", "seq", " seq  ASC ", "Seq Desc")] == [
        False,
        False,
        False,
        True,
    ]
    with pytest.raises(errors.InvalidOrderBy):
        paging.descending("time desc")
