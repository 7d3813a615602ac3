"""The newest-first merge of a cluster-wide listing (``scatter.merge_recent``): by
(update_time desc, id), each session listed by its owner only, never past what every group has
answered for."""

from __future__ import annotations

from sessionlog.shard.scatter import RecentAnswer, merge_recent, recent_key
from sessionlog.v1 import session_log_service_pb2 as pb


def session(session_id: str, ns: int) -> pb.Session:
    listed = pb.Session(session_id=session_id, exists=True)
    listed.update_time.FromNanoseconds(ns)
    return listed


def owner(session_id: str) -> str:
    return session_id.split("-")[0]


def test_merges_newest_first_and_stops_at_the_first_group_bound() -> None:
    """g1 has more after its second session: the page ends there, the next starts after it."""
    g1 = [session("g1-a", 90), session("g1-b", 70)]
    g2 = [session("g2-a", 80), session("g2-b", 60), session("g2-c", 50)]
    answers = [RecentAnswer("g1", g1, recent_key(g1[-1])), RecentAnswer("g2", g2, b"")]
    kept, last = merge_recent(answers, 10, owner)
    assert [s.session_id for s in kept] == ["g1-a", "g2-a", "g1-b"]
    assert last == recent_key(g1[-1])


def test_a_full_page_ends_at_its_last_session_and_ties_go_by_id() -> None:
    same = [session("g2-b", 5), session("g1-z", 5), session("g2-a", 5)]
    answers = [RecentAnswer("g1", [same[1]], b""), RecentAnswer("g2", [same[2], same[0]], b"")]
    kept, last = merge_recent(answers, 2, owner)
    assert [s.session_id for s in kept] == ["g1-z", "g2-a"]
    assert last == recent_key(same[2])
    everything, end = merge_recent(answers, 3, owner)
    assert [s.session_id for s in everything] == ["g1-z", "g2-a", "g2-b"]
    assert end == b""


def test_a_copy_a_group_does_not_own_is_not_listed() -> None:
    answers = [RecentAnswer("g1", [session("g2-moving", 9), session("g1-a", 1)], b"")]
    kept, _ = merge_recent(answers, 10, owner)
    assert [s.session_id for s in kept] == ["g1-a"]
