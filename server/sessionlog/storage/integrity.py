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
from sessionlog.storage import damage, feed_index, indexes, purge, schema
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
    offset: int = 0
    """Where the meta page starts in the file (0, or one page in)."""


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
    return _Meta(page_size, last_pg, txnid, offset)


def _plausible_page_size(size: int) -> bool:
    return 512 <= size <= 65536 and size & (size - 1) == 0


def refuse_damaged(path: Path) -> None:
    """Raise DamagedStore when the data file of folder ``path`` (or ``path`` itself, when it is
    a file: a snapshot) fails :func:`check_data_file`."""
    problem = check_data_file(path if path.is_file() else path / DATA_FILE)
    if problem is not None:
        raise DamagedStore(f"{problem}: {RUNBOOK}")


# -- the free list ------------------------------------------------------------------------------
#
# LMDB's named tables are walked through LMDB, but its free list (the free-page DB, mm_dbs[0])
# is read only by a write transaction that needs pages: damage there passes every read and
# stops the next write, a server's start among them. So verify walks it with plain reads, as
# LMDB's mdb.c lays it out: a B-tree whose pages start with a 16-byte header
#
#     mp_pgno u64 (the page's own number) | mp_pad u16 | mp_flags u16 | lower u16 | upper u16
#
# (an overflow page has mp_pages u32 in place of lower and upper), then lower - 16 bytes of u16
# node offsets. A node is lo u16 | hi u16 | flags u16 | ksize u16 | key | data: a branch node's
# child page is lo | hi << 16 | flags << 32; a leaf's data size is lo | hi << 16, its data the
# pages freed by one transaction (u64 count, then that many u64 page numbers) held in place or,
# with F_BIGDATA, on an overflow page named by a u64.

_FREE_DB = struct.Struct("<HHQQQQQ")  # md_flags, md_depth, branch, leaf, overflow, entries, root
_FREE_DB_OFFSET = PAGE_HEADER + 24 + 4  # mm_dbs[0], past its md_pad
_PAGE_HEAD = struct.Struct("<QHHHH")
_NODE = struct.Struct("<HHHH")
_U64 = struct.Struct("<Q")
P_BRANCH, P_LEAF, P_OVERFLOW = 0x01, 0x02, 0x04
F_BIGDATA = 0x01
P_INVALID = 2**64 - 1
NUM_METAS = 2


def check_free_list(path: Path, txnid: int | None = None) -> list[str]:
    """What is wrong with the free list of ``path`` (a data.mdb) as the meta of transaction
    ``txnid`` (default: the newest valid meta) describes it; [] when it holds together. Plain
    reads only. A caller beside a live writer holds a read transaction of ``txnid`` open, so
    the pages walked stay as they are; a meta already rewritten past it is not walked."""
    try:
        with path.open("rb") as data:
            head = data.read(2 * max(USUAL_PAGE_SIZES))
            metas = _valid_metas(head)
            if not metas:
                return []  # check_data_file's to say
            if txnid is None:
                meta = max(metas, key=lambda m: m.txnid)
            else:
                found = [m for m in metas if m.txnid == txnid]
                if not found:
                    return []
                meta = found[0]
            fields = _FREE_DB.unpack_from(head, meta.offset + _FREE_DB_OFFSET)
            return _FreeWalk(data, meta).walk(*fields)
    except OSError as exc:
        return [f"the data file cannot be read ({exc.strerror or exc})"]


@dataclass
class _FreeWalk:
    data: Any
    meta: _Meta
    problems: list[str] = field(default_factory=list)
    pages: dict[int, int] = field(default_factory=lambda: {P_BRANCH: 0, P_LEAF: 0, P_OVERFLOW: 0})
    entries: int = 0

    def page(self, pgno: int, size: int = 1) -> bytes:
        self.data.seek(pgno * self.meta.page_size)
        return bytes(self.data.read(size * self.meta.page_size))

    def walk(
        self,
        _flags: int,
        depth: int,
        branch: int,
        leaf: int,
        overflow: int,
        entries: int,
        root: int,
    ) -> list[str]:
        if root == P_INVALID:
            if entries:
                self.problems.append(f"the free list has no root page but counts {entries} entries")
            return self.problems
        self._node_page(root, depth, depth)
        counted = (self.pages[P_BRANCH], self.pages[P_LEAF], self.pages[P_OVERFLOW], self.entries)
        if not self.problems and counted != (branch, leaf, overflow, entries):
            self.problems.append(
                f"the free list counts {branch} branch, {leaf} leaf and {overflow} overflow pages "
                f"and {entries} entries, but holds {counted[0]}, {counted[1]}, {counted[2]} and "
                f"{counted[3]}"
            )
        return self.problems

    def _in_file(self, pgno: int, what: str) -> bool:
        if NUM_METAS <= pgno <= self.meta.last_pg:
            return True
        self.problems.append(f"{what} names page {pgno}, outside pages 2 to {self.meta.last_pg}")
        return False

    def _node_page(self, pgno: int, level: int, depth: int) -> None:
        if not self._in_file(pgno, "the free list"):
            return
        raw = self.page(pgno)
        where = f"free list page {pgno}"
        own, _, flags, lower, upper = _PAGE_HEAD.unpack_from(raw)
        kind = P_LEAF if level == 1 else P_BRANCH
        if own != pgno or flags != kind or not PAGE_HEADER <= lower <= upper <= len(raw):
            what = "leaf" if kind == P_LEAF else "branch"
            self.problems.append(f"{where} is not a {what} page of the free list (damaged)")
            return
        self.pages[kind] += 1
        for index in range((lower - PAGE_HEADER) // 2):
            at = struct.unpack_from("<H", raw, PAGE_HEADER + 2 * index)[0]
            if not upper <= at <= len(raw) - _NODE.size:
                self.problems.append(f"{where}: node {index} lies outside the page (damaged)")
                return
            lo, hi, node_flags, ksize = _NODE.unpack_from(raw, at)
            if kind == P_BRANCH:
                self._node_page(lo | hi << 16 | node_flags << 32, level - 1, depth)
                continue
            self.entries += 1
            self._leaf(raw, at + _NODE.size + ksize, lo | hi << 16, node_flags, ksize, where)
            if self.problems:
                return

    def _leaf(self, raw: bytes, at: int, size: int, flags: int, ksize: int, where: str) -> None:
        if ksize != _U64.size:
            self.problems.append(f"{where}: a key of {ksize} bytes, not a transaction id")
            return
        if flags & F_BIGDATA:
            if at + _U64.size > len(raw):
                self.problems.append(f"{where}: a node runs past the page (damaged)")
                return
            (pgno,) = _U64.unpack_from(raw, at)
            pages = -(-(PAGE_HEADER + size) // self.meta.page_size)
            if not self._in_file(pgno, where) or not self._in_file(pgno + pages - 1, where):
                return
            held = self.page(pgno, pages)
            own, _, kind, _, _ = _PAGE_HEAD.unpack_from(held)
            if own != pgno or kind != P_OVERFLOW:
                self.problems.append(f"free list page {pgno} is not an overflow page (damaged)")
                return
            self.pages[P_OVERFLOW] += pages
            raw, at = held, PAGE_HEADER
        if at + size > len(raw) or size < _U64.size or size % _U64.size:
            self.problems.append(f"{where}: a list of free pages of {size} bytes (damaged)")
            return
        (count,) = _U64.unpack_from(raw, at)
        if (count + 1) * _U64.size != size:
            self.problems.append(f"{where}: a list of {count} free pages in {size} bytes (damaged)")
            return
        for index in range(count):
            (pgno,) = _U64.unpack_from(raw, at + _U64.size * (index + 1))
            if not self._in_file(pgno, f"{where}'s list of free pages"):
                return


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
    unreadable: str = ""
    """Why LMDB could not read its events past ``stored`` ("" when it could)."""


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
    record of a session not stored); LMDB's free list holds together (``check_free_list``: damage
    there passes every read but stops the next write, a server's start among them). A table
    LMDB cannot walk to its end is reported and the walk goes on with the next one, in a fresh
    transaction.
    """
    walk = _Walk(file_bytes=_map_bytes(env))
    snapshot = env.begin(buffers=True)
    try:
        whole = _walk_tables(walk, env, tables, change_checks, snapshot)
        if whole:
            _free_list(walk, env, snapshot)
    finally:
        snapshot.abort()
    if not whole:
        with env.begin() as fresh:
            _free_list(walk, env, fresh)
    _session_totals(walk)
    return walk.problems, walk.counts


def _walk_tables(
    walk: _Walk,
    env: lmdb.Environment,
    tables: Tables,
    change_checks: Sequence[ChangeCheck],
    snapshot: lmdb.Transaction,
) -> bool:
    """Every table, read in the one ``snapshot`` so that a live writer beside verify cannot
    make the tables disagree (a session record read before an append, its index key after it).
    LMDB fails a transaction for good once it met a damaged page: from then on each table gets
    a fresh transaction (its own moment, which only a damaged store comes to). Whether the
    snapshot read every table (no damage met)."""
    shared: lmdb.Transaction | None = snapshot
    for name, step in (
        ("sessions", _sessions),
        ("ids", _ids),
        ("events", _events),
        ("changes", lambda w, t, tb: _changes(w, t, tb, change_checks, env)),
        ("requests", _records("requests", RequestRecord.decode, _request_where)),
        ("leases", _records("leases", LeaseRecord.decode, _text_key)),
        ("audit", _records("audit", AuditRecord.decode, _audit_where)),
        ("usage", _records("usage", UsageRecord.decode, _usage_where)),
        ("erasures", _records("erasures", ErasureRecord.decode, _position_where)),
        ("counters", _counters),
        ("records", _indexes),
        ("feed_index", _feed_index),
    ):
        walk.counts[name] = 0
        try:
            if shared is not None:
                step(walk, shared, tables)
            else:
                with env.begin(buffers=True) as txn:
                    step(walk, txn, tables)
        except damage.LMDB_DAMAGE as exc:
            shared = None
            walk.add(name, "table", f"LMDB cannot read this table to its end ({exc})")
            if name == "events":
                _events_by_session(walk, env, tables)
    return shared is not None


def _free_list(walk: _Walk, env: lmdb.Environment, txn: lmdb.Transaction) -> None:
    """The free list's problems (``check_free_list``), walked as of ``txn``, a read
    transaction held open meanwhile, so that a live writer cannot reuse the pages walked."""
    path = Path(env.path())
    path = path / DATA_FILE if path.is_dir() else path
    for what in check_free_list(path, txn.id()):
        walk.add("free list", "pages", what)


def _map_bytes(env: lmdb.Environment) -> int:
    info = env.info()
    used: int = (info["last_pgno"] + 1) * env.stat()["psize"]
    return used


def _items(walk: _Walk, txn: lmdb.Transaction, db: Any, table: str) -> Iterator[tuple[bytes, Any]]:
    """Every (key, value) of ``db``; values stay buffers until checked. A value longer than the
    data file (a damaged size field) is reported, never copied: reading it would crash."""
    return _from_cursor(walk, txn.cursor(db=db), table)


def _from_cursor(
    walk: _Walk, cursor: lmdb.Cursor, table: str, *, restart: bool = False
) -> Iterator[tuple[bytes, Any]]:
    """``_items`` from where ``cursor`` stands (``restart``: already placed) or the start."""
    for key, value in cursor.iternext() if restart else cursor:
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
        _event(walk, session, seq, value)


def _event(walk: _Walk, session: _Session, seq: int, value: Any) -> None:
    """One stored event of ``session``: at the next seq, decoding, holding its own seq."""
    where = f"session '{session.session_id}' seq {seq}"
    if seq != session.stored:
        walk.add("events", where, f"expected seq {session.stored} here (seqs must be dense)")
    session.stored = seq + 1
    try:
        event = Event.FromString(bytes(value))
    except damage.UNDECODABLE as exc:
        walk.add("events", where, f"the event does not decode ({type(exc).__name__})")
        return
    if event.seq != seq:
        walk.add("events", where, f"the event holds seq {event.seq}")
    if fold.replace_range(event) is not None:
        session.replaces += 1


def _events_by_session(walk: _Walk, env: lmdb.Environment, tables: Tables) -> None:
    """After a walk of the events that LMDB stopped (a damaged page, a branch page among them),
    each session whose events were not all reached is read again on its own, from a lookup of
    its next key: one past the damage is reached through the tree's other pages and checked as
    the walk would have, and only one whose own events cannot be read is reported (as that,
    never as a session without events)."""
    for sid, session in walk.by_sid.items():
        if session.stored >= session.meta.next_seq:
            continue
        try:
            with env.begin(buffers=True) as txn:
                cursor = txn.cursor(db=tables.events)
                if not cursor.set_range(schema.event_key(sid, session.stored)):
                    continue
                for key, value in cursor:
                    if len(key) != 16 or schema.read_u64(bytes(key[:8])) != sid:
                        break
                    walk.counts["events"] += 1
                    _event(walk, session, schema.event_key_seq(bytes(key)), value)
        except damage.LMDB_DAMAGE as exc:
            session.unreadable = str(exc)


def _session_totals(walk: _Walk) -> None:
    for session in walk.by_sid.values():
        meta, where = session.meta, f"'{session.session_id}'"
        if session.unreadable:
            walk.add(
                "events",
                f"session {where} seq {session.stored}",
                f"LMDB cannot read this session's events from here on ({session.unreadable}); "
                f"its record counts {meta.next_seq}",
            )
            continue
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


class _EventsUnreadable(Exception):
    """LMDB failed reading the events a change names (not the change itself)."""

    def __init__(self, position: int, cause: Exception) -> None:
        super().__init__(position, cause)
        self.position = position
        self.cause = cause


def _changes(
    walk: _Walk,
    txn: lmdb.Transaction,
    tables: Tables,
    checks: Sequence[ChangeCheck],
    env: lmdb.Environment,
) -> None:
    """The feed in position order. A change whose events LMDB cannot read is reported as that
    and the walk goes on past it in a fresh transaction (LMDB fails a transaction for good once
    it met a damaged page), so a damaged page of events is not taken for the feed's end."""
    start = 1
    while True:
        try:
            if start == 1:
                _changes_from(walk, txn, tables, checks, start)
            else:
                with env.begin(buffers=True) as fresh:
                    _changes_from(walk, fresh, tables, checks, start)
            return
        except _EventsUnreadable as unreadable:
            walk.add(
                "changes",
                f"position {unreadable.position}",
                f"LMDB cannot read the events it names ({unreadable.cause})",
            )
            start = unreadable.position + 1


def _changes_from(
    walk: _Walk, txn: lmdb.Transaction, tables: Tables, checks: Sequence[ChangeCheck], start: int
) -> None:
    expected = start
    events = txn.cursor(db=tables.events)
    cursor = txn.cursor(db=tables.changes)
    if start > 1 and not cursor.set_range(schema.u64(start)):
        return
    for key, value in _from_cursor(walk, cursor, "changes", restart=start > 1):
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
        try:
            named = _named_events(events, change)
        except damage.LMDB_DAMAGE as exc:
            for check in checks:  # a chained check moves past it; its events are the problem
                check(position, record, [])
            raise _EventsUnreadable(position, exc) from None
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


def _feed_index(walk: _Walk, txn: lmdb.Transaction, tables: Tables) -> None:
    """``feed_index`` holds a key for each record that names a session, up to the position it
    says it has reached, and no other (``feed_index``'s invariant; past that position, records
    stored while it was behind may have theirs)."""
    if tables.feed_index is None:  # schema.OPTIONAL_DBS, on a read-only older store
        return
    upto = feed_index.indexed(txn, tables)
    for key, value in txn.cursor(db=tables.changes):
        position = schema.read_u64(key) if len(key) == 8 else 0
        session_id = _named(value) if 0 < position <= upto else ""
        key = feed_index.key(session_id, position) if session_id else b""
        if key and txn.get(key, db=tables.feed_index) is None:
            where = f"'{session_id}' at position {position}"
            walk.add("feed_index", where, "missing: the key of a record that names the session")
    for key, value in _items(walk, txn, tables.feed_index, "feed_index"):
        if key == feed_index.PROGRESS:
            if len(value) != 8:
                walk.add("feed_index", "its progress", "the value is not a u64")
            continue
        session, number = key[:-9], key[-8:]
        record = txn.get(number, db=tables.changes) if key[-9:-8] == b"\x00" else None
        named = "" if record is None else _named(record)
        if not named or named.encode() != session:  # one past ``upto`` may be right
            where = _index_where("feed_index", key)
            walk.add("feed_index", where, "left over: no record names the session there")


def _named(record: Any) -> str:
    """The session a stored change record names ("" for none, or one that does not decode:
    the changes step reports that)."""
    try:
        return rpb.Change.FromString(bytes(record)).session_id
    except damage.UNDECODABLE:
        return ""


def _index_where(table: str, key: bytes) -> str:
    if table == "recent" and len(key) > 8:
        update_ns, session_id = schema.recent_key_parts(key)
        return f"'{session_id}' at {update_ns} ns"
    if table == "feed_index" and len(key) > 9 and key[-9] == 0:
        return f"{_text_key(key[:-9])} at position {schema.read_u64(key[-8:])}"
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
