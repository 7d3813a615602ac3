"""A session's view (GetSession) and its records (GetSessionRecords) read the meta and the
person-set record in one transaction, so the two always describe the same committed state."""

from __future__ import annotations

import threading

from sessionlog.records import SessionRecord
from sessionlog.storage.store import Store
from sessionlog.v1 import event_pb2

ROUNDS = 60


def _step(store: Store, n: int) -> None:
    """One append (the log reaches n events), then a title naming that count."""
    store.append("s", [event_pb2.Event(type=event_pb2.EVENT_TYPE_TOOL_CALL)])
    store.submit_update("s", SessionRecord(title=str(n)), ["title"]).result()


def test_the_view_and_the_records_carry_the_session_record(store: Store) -> None:
    """Both reads return the record UpdateSession wrote; a session without one has None."""
    store.append("bare", [event_pb2.Event(type=event_pb2.EVENT_TYPE_TOOL_CALL)])
    assert store.session("bare").record is None
    assert store.session_records("bare").record is None
    _step(store, 1)
    store.submit_update("s", SessionRecord(labels={"team": "a"}), ["labels"]).result()
    for record in (store.session("s").record, store.session_records("s").record):
        assert record is not None
        assert (record.title, record.labels) == ("1", {"team": "a"})
        assert record.update_time_ns > 0


def test_the_record_never_runs_ahead_of_the_meta_it_is_read_with(store: Store) -> None:
    """While appends and updates alternate (a title n follows the n-th event), every view's
    title is its own event count or one behind it: never a later title beside an older meta."""
    _step(store, 1)
    done = threading.Event()

    def write() -> None:
        try:
            for n in range(2, ROUNDS + 2):
                _step(store, n)
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    seen = set()
    try:
        while not done.is_set():
            for meta, record in (
                (view.meta, view.record)
                for view in (store.session("s"), store.session_records("s"))
            ):
                assert meta is not None
                assert record is not None
                assert int(record.title) in (meta.next_seq, meta.next_seq - 1)
                seen.add(meta.next_seq)
    finally:
        writer.join()
    assert len(seen) > 1  # the reads did overlap the writes
