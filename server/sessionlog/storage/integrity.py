"""Is the data file whole? A check before LMDB maps it, and a walk over every record.

LMDB maps ``data.mdb`` and reads it through memory: a page past the end of a truncated file
kills the process with SIGBUS, with no message. So before LMDB opens the file,
:func:`check_data_file` reads its two meta pages with plain reads and refuses a file that cannot
be what the newest valid meta describes. The meta page (``MDB_meta`` in lmdb's mdb.c), 64-bit
little-endian as py-lmdb writes it here, after a 16-byte page header:

    offset  16  mm_magic    u32   0xBEEFC0DE
            20  mm_version  u32   1
            24  mm_address  u64   (fixed mapping; unused)
            32  mm_mapsize  u64
            40  mm_dbs[0]   the free-page DB (48 bytes); its md_pad holds the page size
            88  mm_dbs[1]   the main DB (48 bytes)
           136  mm_last_pg  u64   the last page in use
           144  mm_txnid    u64   the transaction that wrote this meta

Meta 0 is page 0 and meta 1 page 1; LMDB uses the valid one with the larger txnid, and needs
pages 0 .. mm_last_pg of it in the file.

:func:`verify` (``sessionlog admin verify``) walks every record of every table in read
transactions, so it runs beside a live server, and lists each thing that is damaged or
disagrees with the invariants of ``schema``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lmdb

from sessionlog import errors, fold
from sessionlog.records import SessionRecord
from sessionlog.storage import damage, indexes, purge, schema
from sessionlog.storage.schema import (
    AuditRecord,
    ErasureRecord,
    LeaseRecord,
    RequestRecord,
    SessionMeta,
    UsageRecord,
)
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1.event_pb2 import Event

if TYPE_CHECKING:
    from sessionlog.storage.tables import Tables

DATA_FILE = "data.mdb"
MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
PAGE_HEADER = 16
_META = struct.Struct("<IIQQI")  # magic, version, address, mapsize, free DB md_pad (psize)
_META_TAIL = struct.Struct("<QQ")  # last_pg, txnid
_META_TAIL_OFFSET = PAGE_HEADER + 120
USUAL_PAGE_SIZES = (4096, 8192, 16384, 32768, 65536, 2048, 1024, 512)
RUNBOOK = (
    "restore it from a backup (sessionlog admin restore) or a replica; "
    "see the docs' Troubleshooting, 'Damaged data file'"
)


class DamagedStore(RuntimeError):
    """The data file cannot be opened safely; the message is one line: the file, what is wrong,
    and the way out."""


@dataclass(frozen=True)
class _Meta:
    page_size: int
    last_pg: int
    txnid: int


def check_data_file(path: Path) -> str | None:
    """None when ``path`` (a data.mdb) may be opened by LMDB; else one sentence naming the file
    and what is wrong with it.

    A missing file and a 0-byte one pass: both are a new store to LMDB (whether a 0-byte file
    stands where data used to be is for the data folder's marker to say, not this check). Reads
    the file with plain reads, never mmap, so a damaged file cannot crash the caller.
    """
    try:
        size = path.stat().st_size
        if size == 0:
            return None
        with path.open("rb") as data:
            head = data.read(2 * max(USUAL_PAGE_SIZES))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror or exc})"
    metas = _valid_metas(head)
    if not metas:
        return f"{path} is not an LMDB data file (neither meta page is valid)"
    if size < 2 * metas[0].page_size:
        return f"{path} is {size} bytes, shorter than its two meta pages ({2 * metas[0].page_size})"
    if len(metas) < 2:  # LMDB checks both and refuses the file, so say why here
        return f"{path} has a damaged meta page (one of its two is not valid)"
    if abs(metas[0].txnid - metas[1].txnid) > 1:  # LMDB writes them alternately: n and n +/- 1
        return (
            f"{path} has a damaged meta page (their transaction ids, {metas[0].txnid} and "
            f"{metas[1].txnid}, cannot both be LMDB's)"
        )
    meta = max(metas, key=lambda m: m.txnid)
    needed = (meta.last_pg + 1) * meta.page_size
    if size < needed:
        return (
            f"{path} is truncated: it is {size} bytes, but its last transaction "
            f"({meta.txnid}) uses {needed} (pages 0 to {meta.last_pg} of {meta.page_size} bytes)"
        )
    return None


def _valid_metas(head: bytes) -> list[_Meta]:
    """The meta pages of a file's first bytes that carry LMDB's magic and version. The second
    one is one page in: at meta 0's page size when meta 0 is valid, else tried at each usual
    page size."""
    first = _meta_at(head, 0)
    sizes = (first.page_size,) if first is not None else USUAL_PAGE_SIZES
    found = [first] if first is not None else []
    for page_size in sizes:
        second = _meta_at(head, page_size)
        if second is not None and second.page_size == page_size:
            found.append(second)
            break
    return found


def _meta_at(head: bytes, offset: int) -> _Meta | None:
    if len(head) < offset + _META_TAIL_OFFSET + _META_TAIL.size:
        return None
    magic, version, _, _, page_size = _META.unpack_from(head, offset + PAGE_HEADER)
    if magic != MAGIC or version != DATA_VERSION or not _plausible_page_size(page_size):
        return None
    last_pg, txnid = _META_TAIL.unpack_from(head, offset + _META_TAIL_OFFSET)
    return _Meta(page_size, last_pg, txnid)


def _plausible_page_size(size: int) -> bool:
    return 512 <= size <= 65536 and size & (size - 1) == 0


def refuse_damaged(path: Path) -> None:
    """Raise DamagedStore when the data file of folder ``path`` (or ``path`` itself, when it is
    a file: a snapshot) fails :func:`check_data_file`."""
    problem = check_data_file(path if path.is_file() else path / DATA_FILE)
    if problem is not None:
        raise DamagedStore(f"{problem}: {RUNBOOK}")


# -- verify -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One damaged or inconsistent record: where (table and key, printable) and what."""

    table: str
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.table}: {self.where}: {self.what}"


ChangeCheck = Callable[[int, bytes, Sequence[bytes]], str | None]
"""An extra check of each change record, called in position order with the position, the record
as stored and the stored bytes of the events it names; returns a problem sentence or None.
Checks that chain from one record to the next (a checksum chain) keep their own state."""


@dataclass
class _Session:
    session_id: str
    meta: SessionMeta
    stored: int = 0
    """Events found for it: they are dense from 0, so this is also one past the last seq."""
    replaces: int = 0


@dataclass
class _Walk:
    """What the walk has learned so far, for the checks that compare tables."""

    file_bytes: int
    problems: list[Problem] = field(default_factory=list)
    by_sid: dict[int, _Session] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, table: str, where: str, what: str) -> None:
        self.problems.append(Problem(table, where, what))


def verify(
    env: lmdb.Environment, tables: Tables, *, change_checks: Sequence[ChangeCheck] = ()
) -> tuple[list[Problem], dict[str, int]]:
    """Every problem found in the store, and the records read per table.

    Checks: every session record decodes and ``ids`` maps its sid back to it; each session's
    events decode, their keys are dense 0..next_seq-1 with the seq inside each event matching
    its key, and replace_generation counts its replace events; the change feed is dense from 1,
    each record decodes and names events that exist, and passes every ``change_checks``;
    request, lease, audit, usage and erasure records decode; the session records and their
    indexes agree (``recent`` one key per session at its update time, ``labels`` exactly the
    records' labels, owners and statuses, ``children`` one key per session with a parent, no
    record of a session not stored). A table LMDB cannot walk to its end
    is reported and the walk goes on with the next one, in a fresh transaction.
    """
    walk = _Walk(file_bytes=_map_bytes(env))
    for name, step in (
        ("sessions", _sessions),
        ("ids", _ids),
        ("events", _events),
        ("changes", lambda w, t, tb: _changes(w, t, tb, change_checks)),
        ("requests", _records("requests", RequestRecord.decode, _request_where)),
        ("leases", _records("leases", LeaseRecord.decode, _text_key)),
        ("audit", _records("audit", AuditRecord.decode, _audit_where)),
        ("usage", _records("usage", UsageRecord.decode, _usage_where)),
        ("erasures", _records("erasures", ErasureRecord.decode, _position_where)),
        ("counters", _counters),
        ("records", _indexes),
    ):
        walk.counts[name] = 0
        try:
            with env.begin(buffers=True) as txn:
                step(walk, txn, tables)
        except damage.LMDB_DAMAGE as exc:
            walk.add(name, "table", f"LMDB cannot read this table to its end ({exc})")
    _session_totals(walk)
    return walk.problems, walk.counts


def _map_bytes(env: lmdb.Environment) -> int:
    info = env.info()
    used: int = (info["last_pgno"] + 1) * env.stat()["psize"]
    return used


def _items(walk: _Walk, txn: lmdb.Transaction, db: Any, table: str) -> Iterator[tuple[bytes, Any]]:
    """Every (key, value) of ``db``; values stay buffers until checked. A value longer than the
    data file (a damaged size field) is reported, never copied: reading it would crash."""
    for key, value in txn.cursor(db=db):
        walk.counts[table] += 1
        if len(value) > walk.file_bytes:
            walk.add(table, _hex(bytes(key)), f"value size {len(value)} exceeds the file")
            continue
        yield bytes(key), value


def _hex(key: bytes) -> str:
    return f"key {key.hex()}"


def _text_key(key: bytes) -> str:
    try:
        return f"'{key.decode()}'"
    except UnicodeDecodeError:
        return _hex(key)


def _sessions(walk: _Walk, txn: lmdb.Transaction, tables: Tables) -> None:
    for key, value in _items(walk, txn, tables.sessions, "sessions"):
        where = _text_key(key)
        try:
            session_id = key.decode()
            fold.check_session_id(session_id)
        except (UnicodeDecodeError, errors.InvalidSessionId):
            walk.add("sessions", where, "the key is not a valid session id")
            continue
        try:
            meta = SessionMeta.decode(value)
        except damage.UNDECODABLE as exc:
            walk.add("sessions", where, f"the record does not decode ({type(exc).__name__})")
            continue
        if meta.sid in walk.by_sid:
            other = walk.by_sid[meta.sid].session_id
            walk.add("sessions", where, f"sid {meta.sid} is also session '{other}'")
            continue
        walk.by_sid[meta.sid] = _Session(session_id, meta)


def _ids(walk: _Walk, txn: lmdb.Transaction, tables: Tables) -> None:
    named: set[int] = set()
    for key, value in _items(walk, txn, tables.ids, "ids"):
        if len(key) != 8:
            walk.add("ids", _hex(key), "the key is not a u64 sid")
            continue
        sid = schema.read_u64(key)
        named.add(sid)
        session = walk.by_sid.get(sid)
        if session is None:
            walk.add("ids", f"sid {sid}", "names no session record")
        elif bytes(value) != session.session_id.encode():
            walk.add("ids", f"sid {sid}", f"does not map back to session '{session.session_id}'")
    for sid, session in walk.by_sid.items():
        if sid not in named:
            walk.add("ids", f"sid {sid}", f"missing for session '{session.session_id}'")


def _events(walk: _Walk, txn: lmdb.Transaction, tables: Tables) -> None:
    unknown: set[int] = purge.purging_sids(txn, tables)  # deleted, being freed: not left over
    for key, value in _items(walk, txn, tables.events, "events"):
        if len(key) != 16:
            walk.add("events", _hex(key), "the key is not sid + seq")
            continue
        sid, seq = struct.unpack(">QQ", key)
        session = walk.by_sid.get(sid)
        if session is None:
            if sid not in unknown:
                unknown.add(sid)
                walk.add("events", f"sid {sid}", "events of no session")
            continue
        where = f"session '{session.session_id}' seq {seq}"
        if seq != session.stored:
            walk.add("events", where, f"expected seq {session.stored} here (seqs must be dense)")
        session.stored = seq + 1
        try:
            event = Event.FromString(bytes(value))
        except damage.UNDECODABLE as exc:
            walk.add("events", where, f"the event does not decode ({type(exc).__name__})")
            continue
        if event.seq != seq:
            walk.add("events", where, f"the event holds seq {event.seq}")
        if fold.replace_range(event) is not None:
            session.replaces += 1


def _session_totals(walk: _Walk) -> None:
    for session in walk.by_sid.values():
        meta, where = session.meta, f"'{session.session_id}'"
        if session.stored != meta.next_seq:
            walk.add(
                "sessions", where, f"next_seq is {meta.next_seq} but {session.stored} events exist"
            )
        if session.replaces != meta.replace_generation:
            walk.add(
                "sessions",
                where,
                f"replace_generation is {meta.replace_generation} but {session.replaces} "
                "replace events exist",
            )


def _changes(
    walk: _Walk, txn: lmdb.Transaction, tables: Tables, checks: Sequence[ChangeCheck]
) -> None:
    expected = 1
    events = txn.cursor(db=tables.events)
    for key, value in _items(walk, txn, tables.changes, "changes"):
        if len(key) != 8:
            walk.add("changes", _hex(key), "the key is not a u64 position")
            continue
        position = schema.read_u64(key)
        where = f"position {position}"
        if position != expected:
            walk.add("changes", where, f"expected position {expected} (positions must be dense)")
        expected = position + 1
        record = bytes(value)
        try:
            change = rpb.Change.FromString(record)
        except damage.UNDECODABLE as exc:
            walk.add("changes", where, f"the record does not decode ({type(exc).__name__})")
            continue
        if change.position != position:
            walk.add("changes", where, f"the record holds position {change.position}")
        named = _named_events(events, change)
        if len(named) != change.event_count:
            walk.add(
                "changes",
                where,
                f"names events {change.first_seq}..{change.first_seq + change.event_count - 1} "
                f"of sid {change.internal_id}, but {change.event_count - len(named)} are missing",
            )
        for check in checks:
            problem = check(position, record, named)
            if problem:
                walk.add("changes", where, problem)


def _named_events(cursor: lmdb.Cursor, change: rpb.Change) -> list[bytes]:
    """The stored events a change names (fewer when some are missing)."""
    out: list[bytes] = []
    for seq in range(change.first_seq, change.first_seq + change.event_count):
        value = cursor.get(schema.event_key(change.internal_id, seq))
        if value is not None:
            out.append(bytes(value))
    return out


def _request_where(key: bytes) -> str:
    if len(key) < 8:
        return _hex(key)
    return f"sid {schema.read_u64(key[:8])} request {_text_key(key[8:])}"


def _usage_where(key: bytes) -> str:
    if len(key) < 8:
        return _hex(key)
    return f"sid {schema.read_u64(key[:8])} model {_text_key(key[8:])}"


def _position_where(key: bytes) -> str:
    return f"position {schema.read_u64(key)}" if len(key) == 8 else _hex(key)


def _audit_where(key: bytes) -> str:
    session, _, number = key.rpartition(b"\x00")
    if len(number) != 8:
        return _hex(key)
    return f"session {_text_key(session)} #{schema.read_u64(number)}"


def _records(
    table: str, decode: Callable[[bytes], object], where: Callable[[bytes], str]
) -> Callable[[_Walk, lmdb.Transaction, Tables], None]:
    """A step that checks every record of ``table`` decodes."""

    def step(walk: _Walk, txn: lmdb.Transaction, tables: Tables) -> None:
        if tables.by_name[table] is None:  # schema.OPTIONAL_DBS, on a read-only older store
            return
        for key, value in _items(walk, txn, tables.by_name[table], table):
            try:
                decode(bytes(value))
            except damage.UNDECODABLE as exc:
                walk.add(table, where(key), f"the record does not decode ({type(exc).__name__})")

    return step


def _indexes(walk: _Walk, txn: lmdb.Transaction, tables: Tables) -> None:
    """The session records and the three indexes built from them and the sessions (schema's
    invariants); each entry missing or left over is one problem, named by its key."""
    for name in schema.INDEX_DBS[1:]:
        walk.counts[name.decode()] = 0
    stored = {s.session_id: s.meta for s in walk.by_sid.values()}
    records: dict[str, SessionRecord] = {}
    for key, value in _items(walk, txn, tables.records, "records"):
        where = _text_key(key)
        try:
            session_id = bytes(key).decode()
            records[session_id] = schema.decode_record(value)
        except damage.UNDECODABLE as exc:
            walk.add("records", where, f"the record does not decode ({type(exc).__name__})")
            continue
        if session_id not in stored:
            walk.add("records", where, "the record of a session that is not stored")
    recent = {
        schema.recent_key(indexes.update_time(meta, records.get(session_id)), session_id)
        for session_id, meta in stored.items()
    }
    labels = {
        schema.label_prefix(key, value) + session_id.encode()
        for session_id, record in records.items()
        if session_id in stored
        for key, value in indexes.indexed_pairs(record).items()
    }
    children = {
        schema.child_prefix(meta.parent_id) + session_id.encode()
        for session_id, meta in stored.items()
        if meta.parent_id
    }
    hint = "(a folder from before the indexes: start it once as a static primary)"
    for table, expected, missing in (
        ("recent", recent, f"missing: the session's update-time key {hint}"),
        ("labels", labels, "missing: a label, owner or status of a session's record"),
        ("children", children, f"missing: the link of a session to its parent {hint}"),
    ):
        found = {bytes(key) for key, _ in _items(walk, txn, tables.by_name[table], table)}
        for key in sorted(found - expected):
            walk.add(table, _index_where(table, key), "left over: no session or record has it")
        for key in sorted(expected - found):
            walk.add(table, _index_where(table, key), missing)


def _index_where(table: str, key: bytes) -> str:
    if table == "recent" and len(key) > 8:
        update_ns, session_id = schema.recent_key_parts(key)
        return f"'{session_id}' at {update_ns} ns"
    return key.replace(b"\x00", b" ").decode("utf-8", "replace")


def _counters(walk: _Walk, txn: lmdb.Transaction, tables: Tables) -> None:
    for key, value in _items(walk, txn, tables.counters, "counters"):
        if bytes(key) in schema.TEXT_COUNTERS:
            try:
                bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                walk.add("counters", _text_key(key), "the value is not UTF-8 text")
        elif len(value) != 8:
            walk.add("counters", _text_key(key), "the value is not a u64")
        elif key == schema.NEXT_SID and walk.by_sid:
            next_sid = schema.read_u64(bytes(value))
            if next_sid <= max(walk.by_sid):
                walk.add("counters", "next_sid", f"{next_sid} is not past every sid in use")
