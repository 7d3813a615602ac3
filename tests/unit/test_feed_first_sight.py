"""``shard.feeds.FirstSight``: the every-group tail prints each (session, seq) once, though a
moved slot's events come a second time from the feed of the group it moved to."""

from sessionlog.shard.feeds import FirstSight, Line, change_events
from sessionlog_client.v1 import event_pb2
from sessionlog_client.v1 import replication_service_pb2 as rpb


def line(group: str, position: int, session_id: str, seq: int) -> Line:
    return Line(group, position, session_id, event_pb2.Event(seq=seq))


def test_a_moved_slots_copy_is_passed_over() -> None:
    fresh = FirstSight()
    old = [line("g1", p, "s", seq) for p, seq in ((1, 0), (2, 1), (3, 2))]
    copy = [line("g2", p, "s", seq) for p, seq in ((7, 0), (7, 1), (7, 2))]
    after_flip = line("g2", 8, "s", 3)
    shown = [x for x in [*old, *copy, after_flip] if fresh(x)]
    assert shown == [*old, after_flip]


def test_the_copy_first_then_the_lagging_original() -> None:
    """The two groups' feeds interleave in no fixed order: whichever copy of a seq comes first
    is printed, the other is not, and no seq is lost."""
    fresh = FirstSight()
    lines = [
        line("g1", 1, "s", 0),
        line("g2", 5, "s", 0),
        line("g2", 5, "s", 1),
        line("g2", 5, "s", 2),
        line("g1", 2, "s", 1),
        line("g1", 3, "s", 2),
        line("g2", 6, "s", 3),
    ]
    shown = [(x.group, x.event.seq if x.event else -1) for x in lines if fresh(x)]
    assert shown == [("g1", 0), ("g2", 1), ("g2", 2), ("g2", 3)]


def test_sessions_are_counted_apart() -> None:
    fresh = FirstSight()
    assert fresh(line("g1", 1, "a", 0))
    assert fresh(line("g1", 2, "b", 0))
    assert not fresh(line("g2", 3, "a", 0))
    assert fresh(line("g2", 3, "a", 1))
    assert fresh(line("g1", 9, "c", 4)), "a tail resumed mid-feed starts where the feed is"


def test_a_redaction_and_a_deletion_are_shown() -> None:
    """A redacted event is a rewrite of a seq already shown: printed again. A deletion is
    printed, and the id's seqs start over (a new log of the same id is not passed over)."""
    fresh = FirstSight()
    assert fresh(line("g1", 1, "s", 0))
    assert fresh(line("g1", 1, "s", 1))
    rewritten = event_pb2.Event(seq=0)
    rewritten.redacted.reason = "privacy"
    assert fresh(Line("g1", 2, "s", rewritten))
    assert not fresh(line("g1", 1, "s", 1))  # still a repeat
    assert fresh(Line("g1", 3, "s", None))
    assert fresh(line("g1", 4, "s", 0))


def test_what_a_feed_follower_sees_of_each_change() -> None:
    """A DELETE shows as one deletion, a REDACT as its rewritten events, an append as its
    events, and a placeholder of a deleted session's record as nothing."""
    rewritten = event_pb2.Event(seq=2)
    rewritten.redacted.reason = "r"
    redact = rpb.Change(kind=rpb.CHANGE_KIND_REDACT, session_id="s")
    redact.puts.add(table="events", key=b"k", value=rewritten.SerializeToString())
    redact.puts.add(table="erasures", key=b"p", value=b"{}")
    append = rpb.Change(kind=rpb.CHANGE_KIND_APPEND, session_id="s")
    append.events.add(seq=3)
    assert change_events(rpb.Change(kind=rpb.CHANGE_KIND_DELETE, session_id="s")) == [None]
    assert change_events(redact) == [rewritten]
    assert change_events(append) == [event_pb2.Event(seq=3)]
    placeholder = rpb.Change(kind=rpb.CHANGE_KIND_DELETE, erased=True)
    assert change_events(placeholder) == []
