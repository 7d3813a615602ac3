"""The usage ledger's rows against a real LMDB: they match a fresh fold of the events, they go
out in the change feed, and a store from before the ledger still opens."""

from __future__ import annotations

from pathlib import Path

import lmdb

from sessionlog import fold
from sessionlog.storage import integrity, ledger, schema
from sessionlog.storage.usage import open_readonly
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1.event_pb2 import Event, Usage
from tests.integration.helpers import ASSISTANT, USER, opened


def spent(model: str, tokens: int) -> Event:
    return Event(type=ASSISTANT, usage=Usage(model=model, input_tokens=tokens, output_tokens=1))


def test_rows_equal_a_fresh_fold_of_the_events(tmp_path: Path) -> None:
    """After appends and a fork, each session's rows are fold_usage of its stored events, and
    the fork's inherited part is the fold of what it copied."""
    with opened(tmp_path / "data") as store:
        store.append("s", [spent("a", 10), Event(type=USER), spent("b", 3)])
        store.append("s", [spent("a", 5)])
        store.submit_fork("s", 1, "s.f").result()
        store.append("s.f", [spent("b", 7)])
        for session_id in ("s", "s.f"):
            events = store.decode_events(store.read_session(session_id, 0), 0, session_id)
            assert store.usage(session_id).totals == fold.fold_usage(events)
        own = store.usage("s.f").own
        assert own == {"b": fold.ModelTotals(7, 1, 0, 0, 1)}
        assert integrity.verify(store.env, store.tables)[0] == []


def test_a_lenient_append_counts_only_the_kept_events_usage(tmp_path: Path) -> None:
    """Events a lenient append drops add no usage, whether plain events or other usage events
    stand around them; the rows equal the fold of what was stored."""
    with opened(tmp_path / "data") as store:
        dropped = spent("a", 1000)
        dropped.seq = 7  # refused: the server assigns seqs
        batch = [Event(type=USER), dropped, spent("a", 10), Event(type=USER), spent("b", 2)]
        result = store.append("s", batch, lenient=True)
        assert [index for index, _, _ in result.drops] == [1]
        events = store.decode_events(store.read_session("s", 0), 0, "s")
        assert len(events) == 4
        assert store.usage("s").totals == fold.fold_usage(events)
        assert store.usage("s").totals["a"].input_tokens == 10


def test_every_prefix_equals_a_fresh_fold(tmp_path: Path) -> None:
    """at_seq, whichever side of it is folded (the prefix, or the rest taken off the rows),
    gives the fold of events 0..at_seq, and a fork's own part from parent_event_count."""
    with opened(tmp_path / "data") as store:
        models = ("a", "b", "c")
        store.append("p", [spent(models[i % 3], i + 1) for i in range(9)])
        store.submit_fork("p", 4, "p.f").result()
        store.append("p.f", [spent(models[i % 2], 100 + i) for i in range(6)] + [Event(type=USER)])
        for session_id, parent_length in (("p", 0), ("p.f", 5)):
            events = store.decode_events(store.read_session(session_id, 0), 0, session_id)
            for at_seq in range(len(events)):
                view = store.usage(session_id, at_seq)
                prefix = events[: at_seq + 1]
                assert view.totals == fold.fold_usage(prefix), (session_id, at_seq)
                assert view.own == fold.fold_usage(prefix, parent_length), (session_id, at_seq)
                assert view.event_count == at_seq + 1


def test_rows_travel_as_puts_in_the_change_feed(tmp_path: Path) -> None:
    """The append's record carries the usage table's put, so a replica applies the same row."""
    with opened(tmp_path / "data") as store:
        store.append("s", [spent("m", 42)])
        change = rpb.Change.FromString(store.read_changes(1)[-1])
        rows = [put for put in change.puts if put.table == schema.USAGE.decode()]
        assert len(rows) == 1
        assert schema.UsageRecord.decode(rows[0].value).total.input_tokens == 42


def test_a_store_from_before_the_ledger_opens(tmp_path: Path) -> None:
    """Without the usage table: read-only opens read no usage, a writable open creates it."""
    folder = tmp_path / "data"
    with opened(folder) as store:
        store.append("s", [Event(type=USER)])
    env = lmdb.open(str(folder), max_dbs=len(schema.ALL_DBS))
    table = env.open_db(schema.USAGE)
    with env.begin(write=True) as txn:
        txn.drop(table, delete=True)
    env.close()
    env, tables = open_readonly(str(folder))
    try:
        assert tables.usage is None
        with env.begin() as txn:
            assert ledger.session_usage(txn, tables, "s").totals == {}
        assert integrity.verify(env, tables)[0] == []
    finally:
        env.close()
    with opened(folder) as store:
        store.append("s", [spent("m", 1)])
        assert store.usage("s").totals == {"m": fold.ModelTotals(1, 1, 0, 0, 1)}
