"""A request record keeps the session its create, seed or fork answered (issue 29, item 6)."""

from __future__ import annotations

from sessionlog.records import SessionRecord
from sessionlog.storage.schema import Answer, LeaseRecord, RequestRecord, SessionMeta


def test_an_answer_survives_encoding_whole() -> None:
    """Meta, record and lease come back equal, so a retry replies what the first call did."""
    meta = SessionMeta(sid=7, next_seq=2, replace_generation=1, create_time_ns=5, parent_id="p")
    meta.last_append_time_ns, meta.parent_length = 6, 2
    record = SessionRecord("t", {"team": "blue"}, "ann", "active", 0, 3, 99, True)
    lease = LeaseRecord("w1", 4, 10, 20, ["w0"], 1)
    kept = RequestRecord("f", 0, 2, 2, [(1, "R", "m")], 6, "c", Answer(meta, record, lease))
    assert RequestRecord.decode(kept.encode()) == kept


def test_an_answer_without_record_or_lease_stays_so() -> None:
    kept = RequestRecord("f", 0, 0, 0, [], 6, answer=Answer(SessionMeta(sid=1)))
    assert RequestRecord.decode(kept.encode()) == kept


def test_a_record_without_answer_reads_as_before() -> None:
    """An append's record, or one written before answers were kept, has no answer key."""
    old = b'{"fingerprint":"f","first_seq":0,"count":1,"next_seq":1,"drops":[],"time_ns":3}'
    read = RequestRecord.decode(old)
    assert read.answer is None
    assert RequestRecord.decode(read.encode()) == read
    assert b"answer" not in read.encode()
