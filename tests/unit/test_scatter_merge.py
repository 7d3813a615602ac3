"""The cluster-wide listing's merge (``shard.scatter.merge``): paging through groups' answers
lists every owned session exactly once, in id order, whatever is written between pages."""

from __future__ import annotations

import bisect

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionlog.shard.scatter import Answer, local_only, merge
from sessionlog.v1 import session_log_service_pb2 as pb

GROUPS = ("g1", "g2", "g3")


def page_of(
    ids: list[str], after: str, size: int, group: str, owner: dict[str, str]
) -> tuple[list[pb.Session], str]:
    """What one group's server answers: those of its first ``size`` ids after ``after`` that
    it owns, and the last of them when more follow."""
    start = bisect.bisect_right(ids, after)
    chosen = ids[start : start + size]
    sessions = [pb.Session(session_id=i, exists=True) for i in chosen if owner[i] == group]
    return sessions, chosen[-1] if start + size < len(ids) else ""


def list_all(
    held: dict[str, list[str]], owner: dict[str, str], size: int, between: list[list[str]]
) -> list[str]:
    """Page through the merge until it ends; before page n, the ids of ``between[n]`` are
    created (in their owner's group)."""
    listed: list[str] = []
    after = ""
    for page in range(10_000):
        for new in between[page] if page < len(between) else []:
            bisect.insort(held[owner[new]], new)
        answers = [Answer(g, *page_of(held[g], after, size, g, owner)) for g in GROUPS]
        merged = merge(answers, size, owner.__getitem__)
        assert len(merged.sessions) <= size
        listed.extend(s.session_id for s in merged.sessions)
        if not merged.last:
            return listed
        after = merged.last
    raise AssertionError("the listing did not end")


ids = st.text(alphabet="abcdé0", min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(
    owned=st.dictionaries(ids, st.sampled_from(GROUPS), max_size=60),
    copies=st.dictionaries(ids, st.sampled_from(GROUPS), max_size=10),
    size=st.integers(1, 9),
    later=st.lists(st.dictionaries(ids, st.sampled_from(GROUPS), max_size=4), max_size=6),
)
def test_paging_lists_every_owned_session_once_in_order(
    owned: dict[str, str],
    copies: dict[str, str],
    size: int,
    later: list[dict[str, str]],
) -> None:
    """Every session held from the start is listed exactly once and in id order, copies held
    by a group that does not own them are not, and sessions created between pages are listed
    at most once."""
    owner = dict(owned)
    created: list[list[str]] = []
    for batch in later:
        fresh = [i for i in batch if i not in owner]
        owner.update({i: batch[i] for i in fresh})
        created.append(fresh)
    held: dict[str, list[str]] = {g: [] for g in GROUPS}
    for session_id, group in owned.items():
        held[group].append(session_id)
    for session_id, group in copies.items():
        if session_id in owner and owner[session_id] != group:
            held[group].append(session_id)  # a copy (a slot on the move): not its owner
    for group in GROUPS:
        held[group].sort()
    listed = list_all(held, owner, size, created)
    assert listed == sorted(set(listed)), "in id order, each once"
    assert set(owned) <= set(listed)
    assert set(listed) <= set(owner)


def test_a_short_group_does_not_end_the_page_of_a_long_one() -> None:
    """The page ends at the smallest last id of the groups that have more: past it nothing is
    known of that group yet."""
    owner = {"a": "g1", "b": "g2", "c": "g1", "d": "g2", "e": "g2"}
    answers = [
        Answer("g1", [pb.Session(session_id="a"), pb.Session(session_id="c")], ""),
        Answer("g2", [pb.Session(session_id="b"), pb.Session(session_id="d")], "d"),
    ]
    merged = merge(answers, 2, owner.__getitem__)
    assert [s.session_id for s in merged.sessions] == ["a", "b"]
    assert merged.last == "b"
    merged = merge(answers, 3, owner.__getitem__)
    assert [s.session_id for s in merged.sessions] == ["a", "b", "c"]
    assert merged.last == "c"


def test_a_group_whose_page_holds_only_copies_still_bounds_the_page() -> None:
    """A group that listed nothing it owns but has more: the page ends at its last id, and
    the next one goes on after it."""
    owner = {"a": "g1", "b": "g1", "c": "g2", "z": "g1"}
    answers = [
        Answer("g1", [pb.Session(session_id="a"), pb.Session(session_id="z")], ""),
        Answer("g2", [], "b"),  # it holds a copy of "b"
    ]
    merged = merge(answers, 5, owner.__getitem__)
    assert [s.session_id for s in merged.sessions] == ["a"]
    assert merged.last == "b"


def test_the_scope_header_asks_for_one_group() -> None:
    """``x-sessionlog-scope: group`` and nothing else turns the fan-out off."""
    assert local_only([("x-sessionlog-scope", "group")])
    assert local_only([("authorization", "Bearer t"), ("x-sessionlog-scope", b"group")])
    assert not local_only([("x-sessionlog-scope", "cluster")])
    assert not local_only(None)
