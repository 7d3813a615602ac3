"""Every LMDB database sessionlog uses, and the format of every key and value, in one place.

One environment holds every session. Named databases:

    sessions   session id (UTF-8)            -> SessionMeta (packed binary, see SessionMeta;
               its format byte also says whether ImportSession created the session)
               Ordered by id, so listing and prefix filters are a cursor range.
    ids        sid (u64 BE)                  -> session id (UTF-8)
               The reverse map of the fixed-width internal id.
    events     sid (u64 BE) + seq (u64 BE)   -> serialized sessionlog.v1.Event
               A session's events are one contiguous, seq-ordered key range: Since is a cursor
               walk over exactly the events it returns.
    requests   sid (u64 BE) + request id     -> RequestRecord (JSON)
               Idempotency: what an append, create, seed or fork with a request_id wrote, for
               replays. A fork's record is keyed by its parent's sid (the child's id may be
               generated, so a retry could not find it under the child), which makes a
               session's request ids one namespace for its appends and the forks taken of it.
    counters   name (ASCII)                  -> u64 BE, or UTF-8 text for the identity keys
               next_sid: the internal id the next new session gets.
               history_id (text), history_start (u64), instance (text), replica_of (text):
               the folder's history identity (see ``identity``); leadership (JSON text): its
               epoch, role and epoch history (see ``leadership``); rejoined (JSON text): what
               the last rejoin discarded. Never in the change feed.
    leases     session id (UTF-8)            -> LeaseRecord (JSON)
               Keyed by id, not sid: a lease may be taken before the session's first write.
    changes    position (u64 BE)             -> serialized sessionlog.v1.Change, minus its events
               The global change feed, dense from 1 (see ``changes``).
    audit      session id + 0x00 + n (u64 BE) -> AuditRecord (JSON)
               Lease takeovers and forced releases, in order. Ids cannot contain 0x00, so one
               session's records are one contiguous range.
    usage      sid (u64 BE) + model (UTF-8)  -> UsageRecord (packed binary, see UsageRecord)
               The usage ledger: per session and model, the sums of every event's usage, and
               the part a fork copied from its parent. A session's models are one contiguous
               range in model order; a session with no usage has no rows.
    erasures   change position (u64 BE)      -> ErasureRecord (JSON)
               The erasure audit: one record per DeleteSession / RedactEvents, keyed by the
               position of its change record. What was erased, when, by whom, how much: never
               the content.
    redactions sid (u64 BE)                  -> u64 BE
               How many RedactEvents calls changed the session's events; the fold memo keys
               on it, so every process of a server sees a redaction (``store``).
    records    session id (UTF-8)            -> last UpdateSession time (u64 BE ns, 0: never)
                                                + SessionRecord fields (JSON)
               What a person sets on a session (``sessionlog.records``); only sessions that
               have such fields (or a sub-agent parent_seq) have a record. Apart from SessionMeta
               so that appends, which read the meta every time, never decode it: an append
               reads the first 8 bytes only (its update time, for the ``recent`` index).
    recent     (2^64 - 1 - update time ns) (u64 BE) + session id -> empty
               Every session once, by update time (the later of its last append and its last
               UpdateSession), newest first: ListSessions' "update_time desc" is a cursor walk.
               Moved (one remove, one put) in the transaction of every append and update. A
               folder written before this table existed is filled by ``records.ReindexCommand``.
    labels     label key + 0x00 + value + 0x00 + session id -> empty
               Sessions by label, in id order within a key and value: a filter
               ``labels.K = "V"`` lists by id from this range. Owner and status are indexed
               here too, under the keys "/owner" and "/status", which no label key can be.
               Keys and values cannot hold 0x00 (``records``' rules).
    children   parent session id + 0x00 + child session id -> empty
               The sub-agent children and forks of a session, in id order (filter
               ``parent = "ID"``).
    expiry     expire time ns (u64 BE) + session id -> empty
               The unpinned sessions that have an expire_time, soonest first: the retention
               sweeper (``retention``) reads it from the start up to now, never every session.
               Kept by every write of a record (``indexes.put_record``); removed by a delete.

    purges     sid (u64 BE)                  -> Purge (JSON; see ``purge``)
               A long session deleted in chunks: its tombstone removed what readers see at
               once, and the mark says what its chunks still have to free (its feed records
               to rewrite, then its events, request and usage rows). Removed by the last chunk.
    feed_index session id + 0x00 + position (u64 BE) -> empty
               The change records that named each session when stored (see ``feed_index``):
               an erase reads its session's records from here, not by walking the feed. Put
               with each record on every copy, never carried in the feed. Its key 0x00
               (no session id begins with it) -> u64: how far it goes, kept in the table so
               that a copy without the table has no progress either.

Invariants (the single writer thread keeps them; every change commits in one transaction):
- seq is dense from 0 per session: events holds exactly the keys (sid, 0) .. (sid, next_seq - 1);
- an event's stored bytes never change after commit, with one exception: RedactEvents rewrites
  an event to its redacted form (same seq, type, time, surface_op and usage; no data or
  state_delta;
  ``redacted`` set), so the fold's shape (positions, shadowing, replace_generation) holds;
- a deleted session leaves no key in any per-session table (``erasure.PER_SESSION``); the
  change records that wrote it are rewritten to erased placeholders (see ``changes``); a long
  session's events, request and usage rows, and the rewriting of its records, may wait for
  the chunks of its ``purges`` mark (``purge``), but no reader finds the session meanwhile;
- SessionMeta.next_seq and .replace_generation match the events stored for that session;
- sid values are never reused, so a session id maps to one key prefix for all time;
- every committed write has exactly one record in ``changes``, committed with it;
- a session's usage rows equal ``fold.fold_usage`` over its stored events (an append that
  carries usage updates them in its own transaction, a fork writes its child's).
- ``recent`` holds exactly one key per session: its current update time (an index removal
  travels in the change feed as a StoragePut with remove set, so replicas match);
- ``labels`` holds exactly the (key, value, id) of every record's labels; ``children`` one key
  per session with a parent;
- ``expiry`` holds exactly one key per session whose record has an expire_time and is not
  pinned, at that time.

Variable-length session ids are never used as a key prefix: "ab" and "abc" would interleave. The
fixed-width sid keeps each session's events contiguous.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sessionlog.fold import ModelTotals
from sessionlog.records import SessionRecord

SESSIONS = b"sessions"
IDS = b"ids"
EVENTS = b"events"
REQUESTS = b"requests"
COUNTERS = b"counters"
LEASES = b"leases"
AUDIT = b"audit"
CHANGES = b"changes"
USAGE = b"usage"
ERASURES = b"erasures"
REDACTIONS = b"redactions"
RECORDS = b"records"
RECENT = b"recent"
LABELS = b"labels"
CHILDREN = b"children"
EXPIRY = b"expiry"
PURGES = b"purges"
FEED_INDEX = b"feed_index"
INDEX_DBS = (RECORDS, RECENT, LABELS, CHILDREN)
"""The session record tables (issue 17): a folder written before them lacks them until a
server opens it for writing (which creates them; a static primary then fills the indexes)."""
ALL_DBS = (
    SESSIONS,
    IDS,
    EVENTS,
    REQUESTS,
    COUNTERS,
    LEASES,
    AUDIT,
    CHANGES,
    USAGE,
    ERASURES,
    REDACTIONS,
    RECORDS,
    RECENT,
    LABELS,
    CHILDREN,
    EXPIRY,
    PURGES,
    FEED_INDEX,
)
OPTIONAL_DBS = frozenset({USAGE, ERASURES, REDACTIONS, EXPIRY, PURGES, FEED_INDEX})
"""Tables added after stores were first written: a folder no server of this version has opened
for writing lacks them (a server creates them, empty, on open, which is what they would hold). A
read-only open (``sessionlog admin``, ``verify``, a rejoin's old store) has no handle for them
(None in ``Tables``) and reads them as empty."""

NEXT_SID = b"next_sid"
HISTORY_ID = b"history_id"
HISTORY_START = b"history_start"
INSTANCE = b"instance"
FOLLOWS = b"replica_of"
"""Set while the folder is opened as a replica: the primary it follows."""
LEADERSHIP = b"leadership"
"""The folder's epoch, role and epoch history (JSON text; see ``leadership``)."""
REJOINED = b"rejoined"
"""What the folder's last rejoin discarded, in short (JSON text; see ``cluster.rejoin``)."""
TEXT_COUNTERS = frozenset({HISTORY_ID, INSTANCE, FOLLOWS, LEADERSHIP, REJOINED})
"""The counters whose values are UTF-8 text, not u64."""

_U64 = struct.Struct(">Q")
_EVENT_KEY = struct.Struct(">QQ")
_META = struct.Struct(">BQQQqqQ")
"""A SessionMeta: format, sid, next_seq, replace_generation, create and last-append times (signed
ns), parent_length; the parent id's UTF-8 bytes follow."""
META_FORMAT = 1
"""The first byte of a packed SessionMeta. The JSON form it replaced starts with "{" (0x7B)."""
META_FORMAT_IMPORTED = 2
"""The first byte of a packed SessionMeta of a session ImportSession created (same layout):
only such a session takes further import chunks (``storage.imports``)."""


def u64(value: int) -> bytes:
    return _U64.pack(value)


def read_u64(raw: bytes | memoryview) -> int:
    value: int = _U64.unpack(raw)[0]
    return value


def event_key(sid: int, seq: int) -> bytes:
    return _EVENT_KEY.pack(sid, seq)


def event_key_seq(key: bytes) -> int:
    value: int = _EVENT_KEY.unpack(key)[1]
    return value


def request_key(sid: int, request_id: str) -> bytes:
    return _U64.pack(sid) + request_id.encode("utf-8")


def usage_key(sid: int, model: str) -> bytes:
    return _U64.pack(sid) + model.encode("utf-8")


def usage_key_model(key: bytes) -> str:
    return key[8:].decode("utf-8")


_NEWEST = (1 << 64) - 1


def recent_key(update_time_ns: int, session_id: str) -> bytes:
    return _U64.pack(_NEWEST - max(0, update_time_ns)) + session_id.encode("utf-8")


def recent_key_parts(key: bytes) -> tuple[int, str]:
    """(update time ns, session id) of a ``recent`` key."""
    return _NEWEST - read_u64(key[:8]), key[8:].decode("utf-8")


def expiry_key(expire_time_ns: int, session_id: str) -> bytes:
    return _U64.pack(max(0, expire_time_ns)) + session_id.encode("utf-8")


def expiry_key_parts(key: bytes) -> tuple[int, str]:
    """(expire time ns, session id) of an ``expiry`` key."""
    return read_u64(key[:8]), key[8:].decode("utf-8")


def label_prefix(key: str, value: str | None = None) -> bytes:
    """The ``labels`` range of one key (every value) or of one key and value."""
    head = key.encode("utf-8") + b"\x00"
    return head if value is None else head + value.encode("utf-8") + b"\x00"


def child_prefix(parent_id: str) -> bytes:
    return parent_id.encode("utf-8") + b"\x00"


def encode_record(record: SessionRecord) -> bytes:
    fields: dict[str, object] = {}
    for name in ("title", "labels", "owner", "status"):
        if getattr(record, name):
            fields[name] = getattr(record, name)
    if record.parent_seq is not None:
        fields["parent_seq"] = record.parent_seq
    if record.expire_time_ns:
        fields["expire_time_ns"] = record.expire_time_ns
    if record.pinned:
        fields["pinned"] = True
    body = json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()
    return _U64.pack(record.update_time_ns) + body


def decode_record(raw: bytes | memoryview) -> SessionRecord:
    data = bytes(raw)
    fields = json.loads(data[8:])
    return SessionRecord(
        title=fields.get("title", ""),
        labels=dict(fields.get("labels", {})),
        owner=fields.get("owner", ""),
        status=fields.get("status", ""),
        update_time_ns=read_u64(data[:8]),
        parent_seq=fields.get("parent_seq"),
        expire_time_ns=fields.get("expire_time_ns", 0),
        pinned=fields.get("pinned", False),
    )


def audit_prefix(session_id: str) -> bytes:
    return session_id.encode("utf-8") + b"\x00"


def audit_key(session_id: str, n: int) -> bytes:
    return audit_prefix(session_id) + _U64.pack(n)


def split_audit_key(key: bytes) -> tuple[str, int]:
    """An audit key's session id and record number (ValueError for anything else)."""
    if len(key) < 10 or key[-9] != 0:
        raise ValueError("not an audit key")
    return key[:-9].decode("utf-8"), read_u64(key[-8:])


def session_uid(session_id: str, meta: SessionMeta | None) -> str:
    """Session.uid: the name of this incarnation of the session, a hash of its id and its
    creation time; empty for a session not stored. A session deleted and written again is
    created at another time, so it has another; a slot move, a replica and an import keep the
    creation time (an import under another id has another uid). The internal id is left out:
    a move gives the session a new one, and it never leaves the store."""
    if meta is None:
        return ""
    packed = session_id.encode() + struct.pack(">Q", meta.create_time_ns)
    return hashlib.blake2b(packed, digest_size=12).hexdigest()


@dataclass
class SessionMeta:
    """What the store knows about a session besides its events."""

    sid: int
    next_seq: int = 0
    replace_generation: int = 0
    create_time_ns: int = 0
    last_append_time_ns: int = 0
    parent_id: str = ""
    parent_length: int = 0
    imported: bool = False
    """Created by ImportSession (stored as the format byte META_FORMAT_IMPORTED)."""

    def encode(self) -> bytes:
        # Packed, not JSON: this is read and written on every append.
        return _META.pack(
            META_FORMAT_IMPORTED if self.imported else META_FORMAT,
            self.sid,
            self.next_seq,
            self.replace_generation,
            self.create_time_ns,
            self.last_append_time_ns,
            self.parent_length,
        ) + self.parent_id.encode("utf-8")

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> SessionMeta:
        data = bytes(raw)
        if data[:1] == b"{":  # the JSON form written before the packed one
            return cls(**json.loads(data))
        format_, sid, next_seq, generation, created, appended, parent_length = _META.unpack_from(
            data
        )
        if format_ != META_FORMAT and format_ != META_FORMAT_IMPORTED:
            raise ValueError(f"unknown session record format {format_}")
        parent_id = data[_META.size :].decode("utf-8") if len(data) > _META.size else ""
        imported = format_ == META_FORMAT_IMPORTED
        # Positional, in field order: read on every append, and half the cost of keywords.
        return cls(sid, next_seq, generation, created, appended, parent_id, parent_length, imported)


_USAGE = struct.Struct(">B10Q")
USAGE_FORMAT = 1


@dataclass
class UsageRecord:
    """One session's usage of one model: the whole log's sums, and the copied part of them."""

    total: ModelTotals = field(default_factory=ModelTotals)
    """Over every event of the session, shadowed and hidden ones and a fork's copies included."""
    inherited: ModelTotals = field(default_factory=ModelTotals)
    """Over the events a fork copied from its parent (seq < parent_length); zero otherwise."""

    def encode(self) -> bytes:
        return _USAGE.pack(USAGE_FORMAT, *self.total.values(), *self.inherited.values())

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> UsageRecord:
        format_, *counts = _USAGE.unpack(bytes(raw))
        if format_ != USAGE_FORMAT:
            raise ValueError(f"unknown usage record format {format_}")
        return cls(ModelTotals(*counts[:5]), ModelTotals(*counts[5:]))


@dataclass
class Answer:
    """A session as the reply of a create, seed or fork described it. The write's request
    record keeps it, so that a retry answers exactly what the first call answered, whatever
    was appended, updated or leased since."""

    meta: SessionMeta
    record: SessionRecord | None = None
    lease: LeaseRecord | None = None
    """The live lease the reply showed; None: none was live."""

    def encode(self) -> dict[str, Any]:
        return {
            "meta": self.meta.encode().hex(),
            "record": None if self.record is None else encode_record(self.record).hex(),
            "lease": None if self.lease is None else asdict(self.lease),
        }

    @classmethod
    def decode(cls, fields: dict[str, Any]) -> Answer:
        record, lease = fields["record"], fields["lease"]
        return cls(
            SessionMeta.decode(bytes.fromhex(fields["meta"])),
            None if record is None else decode_record(bytes.fromhex(record)),
            None if lease is None else LeaseRecord(**lease),
        )


@dataclass
class RequestRecord:
    """The outcome of a write that carried a request_id, kept to answer its retries."""

    fingerprint: str
    """What the request asked for (its kind included), to tell a retry from a reuse."""
    first_seq: int
    count: int
    next_seq: int
    drops: list[tuple[int, str, str]]
    time_ns: int
    child_id: str = ""
    """A fork's record only: the child it made (kept under the parent's sid)."""
    answer: Answer | None = None
    """A create's, seed's or fork's record: the session its reply described. None in an append's
    record, and in one a slot move or an import carried (SessionRequestRecord has no field for
    it): a retry then describes the session as it is now."""

    def encode(self) -> bytes:
        fields = asdict(replace(self, answer=None))
        del fields["answer"]
        if self.answer is not None:
            fields["answer"] = self.answer.encode()
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> RequestRecord:
        fields = json.loads(bytes(raw))
        fields["drops"] = [tuple(d) for d in fields["drops"]]
        answer = fields.pop("answer", None)
        return cls(**fields, answer=None if answer is None else Answer.decode(answer))


@dataclass
class LeaseRecord:
    """A session's writer lease. ``holder`` is empty once released; the token is kept."""

    holder: str
    token: int
    acquire_time_ns: int
    expire_time_ns: int
    former_holders: list[str]
    """The most recent holders that lost or gave up this lease (for LEASE_LOST vs LEASE_HELD)."""
    audit_count: int = 0
    """How many audit records this session has; the next one gets this number."""

    def live(self, now_ns: int) -> bool:
        return bool(self.holder) and self.expire_time_ns > now_ns

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> LeaseRecord:
        return cls(**json.loads(bytes(raw)))


TAKEOVER = "TAKEOVER"
FORCED_RELEASE = "FORCED_RELEASE"


@dataclass
class AuditRecord:
    """One lease takeover or forced release."""

    kind: str
    actor: str
    previous_holder: str
    previous_token: int
    time_ns: int

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> AuditRecord:
        return cls(**json.loads(bytes(raw)))


DELETE = "DELETE"
REDACT = "REDACT"


@dataclass
class ErasureRecord:
    """One erasure, for audit: what kind, of which session, by whom, when and how much. Never
    the erased content. The session id is kept (an operator must be able to show that session X
    was erased); ids must therefore not carry personal data themselves (README "Erasure")."""

    kind: str
    session_id: str
    sid: int
    actor: str
    reason: str
    time_ns: int
    event_count: int
    """DELETE: the events the session held; REDACT: the events redacted."""
    seqs: list[int]
    """REDACT: the seqs redacted (empty for DELETE)."""
    feed_records: int
    """How many earlier change records were rewritten to erased placeholders."""

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> ErasureRecord:
        return cls(**json.loads(bytes(raw)))
