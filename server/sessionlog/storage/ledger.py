"""The usage ledger's rows (schema ``usage``): per session and model, the token sums of its events.

The rows are kept so that reading a session's totals never reads its events: an append whose
events carry usage adds to them in the writer's transaction, and a fork writes its child's rows
from the events it copies (marked inherited, so the child's own spending can be told apart).
Every row is an ordinary put, so the change feed carries it and a replica holds the same bytes.
A prefix of the log (at_seq) is not kept: the store folds those events (``fold.fold_usage``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field

from sessionlog import errors, fold
from sessionlog.storage import damage, schema
from sessionlog.storage.reads import Txn, load_meta, read_range
from sessionlog.storage.recording import RecordingTxn
from sessionlog.storage.schema import SessionMeta, UsageRecord
from sessionlog.storage.tables import Tables
from sessionlog.v1.event_pb2 import Event


def load(txn: Txn, tables: Tables, sid: int, session_id: str = "") -> dict[str, UsageRecord]:
    """The usage rows of the session stored under ``sid``, by model, in model order (UTF-8
    bytes). One cursor walk over the session's rows; DataCorrupted names a damaged one."""
    prefix = schema.u64(sid)
    out: dict[str, UsageRecord] = {}
    if tables.usage is None:  # a store from before the ledger, opened read-only
        return out
    with damage.reading(f"the usage of session '{session_id or sid}'", session_id=session_id):
        cursor = txn.cursor(db=tables.usage)
        if not cursor.set_range(prefix):
            return out
        for key, value in cursor:
            key = bytes(key)
            if not key.startswith(prefix):
                break
            out[schema.usage_key_model(key)] = UsageRecord.decode(value)
    return out


def record_appended(txn: RecordingTxn, tables: Tables, sid: int, events: Iterable[Event]) -> None:
    """Add the usage of appended events to their session's rows (one put per model touched)."""
    spent = fold.fold_usage(events)
    for model, totals in spent.items():
        key = schema.usage_key(sid, model)
        raw = txn.get(key, db=tables.usage)
        record = UsageRecord() if raw is None else UsageRecord.decode(raw)
        record.total = record.total.plus(totals)
        txn.put(key, record.encode(), db=tables.usage)


def record_imported(
    txn: RecordingTxn,
    tables: Tables,
    sid: int,
    first_seq: int,
    events: Sequence[Event],
    copied: int,
) -> None:
    """Add the usage of imported events (seqs first_seq onward) to their session's rows; those
    below ``copied`` (an imported fork's parent_length) count as inherited too, as a fork's do."""
    spent = fold.fold_usage(events)
    if not spent:
        return
    inherited = fold.fold_usage(events[: max(0, copied - first_seq)])
    for model, totals in spent.items():
        key = schema.usage_key(sid, model)
        raw = txn.get(key, db=tables.usage)
        record = UsageRecord() if raw is None else UsageRecord.decode(raw)
        record.total = record.total.plus(totals)
        if model in inherited:
            record.inherited = record.inherited.plus(inherited[model])
        txn.put(key, record.encode(), db=tables.usage)


def record_fork(txn: RecordingTxn, tables: Tables, sid: int, copied: Iterable[Event]) -> None:
    """Write a fork child's rows: the usage of the events it copied, all of it inherited."""
    for model, totals in fold.fold_usage(copied).items():
        record = UsageRecord(total=totals, inherited=totals.plus(fold.ModelTotals()))
        txn.put(schema.usage_key(sid, model), record.encode(), db=tables.usage)


def totals(rows: dict[str, UsageRecord]) -> fold.UsageByModel:
    """The whole-log totals of a session's rows."""
    return {model: record.total for model, record in rows.items()}


def own(rows: dict[str, UsageRecord]) -> fold.UsageByModel:
    """What the session spent itself: its totals less what a fork copied."""
    inherited = {model: record.inherited for model, record in rows.items()}
    return fold.own_usage(totals(rows), inherited)


@dataclass
class SessionUsage:
    """What GetUsage reports: a session's totals, its own part, and the descendants added."""

    totals: fold.UsageByModel
    own: fold.UsageByModel
    event_count: int
    descendants: list[str] = dc_field(default_factory=list)


def session_usage(
    txn: Txn, tables: Tables, session_id: str, at_seq: int | None = None
) -> SessionUsage:
    """A session's usage over its whole log (its rows: no event is read) or over events
    0..at_seq, BoundaryOutOfRange past the end. A prefix folds whichever side of at_seq is
    shorter: the prefix itself, or the events after it, subtracted from the rows (read in the
    same transaction, so they agree), which makes a view near the end cheap too."""
    meta = load_meta(txn, tables, session_id)
    count = 0 if meta is None else meta.next_seq
    if at_seq is not None and at_seq >= count:
        raise errors.BoundaryOutOfRange(
            f"at_seq {at_seq} is past the end of session '{session_id}' ({count} events)",
            at_seq=at_seq,
            next_seq=count,
        )
    if meta is None:
        return SessionUsage({}, {}, 0)
    if at_seq is None:
        rows = load(txn, tables, meta.sid, session_id)
        return SessionUsage(totals(rows), own(rows), count)
    after = count - at_seq - 1
    if after < at_seq + 1 and at_seq + 1 >= meta.parent_length:
        # Every later event is the session's own, so it comes off its own usage as well.
        rows = load(txn, tables, meta.sid, session_id)
        later = fold.fold_usage(_events(txn, tables, meta.sid, at_seq + 1, count, session_id))
        return SessionUsage(
            fold.own_usage(totals(rows), later), fold.own_usage(own(rows), later), at_seq + 1
        )
    events = _events(txn, tables, meta.sid, 0, at_seq + 1, session_id)
    return SessionUsage(
        fold.fold_usage(events), fold.fold_usage(events, meta.parent_length), at_seq + 1
    )


def _events(
    txn: Txn, tables: Tables, sid: int, start: int, stop: int, session_id: str
) -> list[Event]:
    """Events start..stop-1, decoded; DataCorrupted when any is damaged or missing."""
    raws = read_range(txn, tables, sid, start, stop, session_id=session_id)
    events = damage.decode_events(raws, start, session_id)
    if len(events) != stop - start:
        raise damage.missing_events(session_id, start + len(events), stop)
    return events


def fork_descendants(txn: Txn, tables: Tables, session_id: str) -> list[str]:
    """The sessions forked from ``session_id``, from their forks, and so on, in id order.

    Found by each session's parent id, so this walks every session record once: O(sessions),
    meant for an occasional report. (Sub-agent links, once sessions have them, can hand their
    own list to ``tree``.) A session created before its parent is not that parent's: it was
    forked from an earlier session of the parent's id, since deleted (a child is always made
    after its parent, and an import keeps both times).
    """
    created: dict[str, int] = {}
    children: dict[str, list[str]] = {}
    with damage.reading("the session list, for fork descendants"):
        for key, value in txn.cursor(db=tables.sessions):
            meta = SessionMeta.decode(value)
            name = bytes(key).decode("utf-8")
            created[name] = meta.create_time_ns
            if meta.parent_id:
                children.setdefault(meta.parent_id, []).append(name)
    found: list[str] = []
    pending = [(session_id, child) for child in children.get(session_id, ())]
    while pending:
        parent, child = pending.pop()
        if child == session_id or child in found or created[child] < created.get(parent, 0):
            continue
        found.append(child)
        pending.extend((child, grandchild) for grandchild in children.get(child, ()))
    return sorted(found, key=lambda sid: sid.encode("utf-8"))


def tree(txn: Txn, tables: Tables, root: str, descendants: Sequence[str]) -> SessionUsage:
    """The usage of ``root`` with ``descendants`` added, each counting only its own part
    (``fold.tree_usage``); a descendant never written adds nothing."""
    mine = session_usage(txn, tables, root)
    parts = []
    for session_id in descendants:
        meta = load_meta(txn, tables, session_id)
        if meta is not None:
            parts.append(own(load(txn, tables, meta.sid, session_id)))
    return SessionUsage(
        fold.tree_usage(mine.totals, parts), mine.own, mine.event_count, list(descendants)
    )


def many(txn: Txn, tables: Tables, session_ids: Iterable[str]) -> dict[str, fold.UsageByModel]:
    """The whole-log totals of several sessions (a listing's page), read in one transaction."""
    out: dict[str, fold.UsageByModel] = {}
    for session_id in session_ids:
        meta = load_meta(txn, tables, session_id)
        out[session_id] = {} if meta is None else totals(load(txn, tables, meta.sid, session_id))
    return out
