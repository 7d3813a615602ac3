"""ImportSession and GetSessionRecords over gRPC: a session written as it was elsewhere.

Seqs, times and the record (create and last-append time, fork parent) are kept; chunks continue
an import at its next seq and nothing else; events are checked as Append checks them; the extras
of a slot move (request records, lease, audit) need an admin token, and a tenant imports inside
its prefix only. One server (auth on, the tokens of ``test_auth``) for the module.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from sessionlog.testing import RunningServer
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import check, ev, failure, replace, user
from tests.e2e._proc import running_server
from tests.e2e.test_auth import ADMIN, TENANT_A, WRITER, tokens_file

T0 = 1_700_000_000_123_456_000
"""A past time, in ns, to the microsecond (what Timestamp keeps exactly here)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("import")
    tokens = tokens_file(root / "tokens.toml")
    with running_server(root / "data", auth_tokens=str(tokens)) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> pb_grpc.SessionLogServiceStub:
    return pb_grpc.SessionLogServiceStub(server.channel())  # type: ignore[no-untyped-call]


def as_(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def stamp(ns: int) -> Timestamp:
    value = Timestamp()
    value.FromNanoseconds(ns)
    return value


def timed(seq: int, content: str, ns: int) -> event_pb2.Event:
    event = user(content)
    event.seq = seq
    event.time.CopyFrom(stamp(ns))
    return event


def stored(stub: pb_grpc.SessionLogServiceStub, session_id: str) -> list[event_pb2.Event]:
    request = pb.SinceRequest(session_id=session_id)
    return [e for r in stub.Since(request, metadata=as_(ADMIN), timeout=5) for e in r.events]


def record(stub: pb_grpc.SessionLogServiceStub, session_id: str) -> pb.Session:
    request = pb.GetSessionRequest(session_id=session_id)
    session: pb.Session = stub.GetSession(request, metadata=as_(ADMIN), timeout=5).session
    return session


def test_chunks_keep_seqs_times_and_the_record(stub: pb_grpc.SessionLogServiceStub) -> None:
    """Two chunks: the session holds the events with their seqs and times, and the record."""
    first = pb.ImportSessionRequest(
        session_id="imp-1",
        events=[timed(0, "a", T0 + 1000), timed(1, "b", T0 + 2000)],
        create_time=stamp(T0),
        last_append_time=stamp(T0 + 2000),
        parent_session_id="imp-parent",
        parent_event_count=1,
    )
    reply = stub.ImportSession(first, metadata=as_(WRITER), timeout=5)
    assert (reply.imported_count, reply.session.event_count) == (2, 2)
    later = pb.ImportSessionRequest(
        session_id="imp-1",
        first_seq=2,
        events=[timed(2, "c", T0 + 3000), replace(0, 1, "sum")],
    )
    later.events[1].seq = 3
    later.events[1].time.CopyFrom(stamp(T0 + 9000))
    reply = stub.ImportSession(later, metadata=as_(WRITER), timeout=5)
    assert reply.imported_count == 2
    events = stored(stub, "imp-1")
    assert [e.seq for e in events] == [0, 1, 2, 3]
    assert [e.time.ToNanoseconds() for e in events] == [T0 + 1000, T0 + 2000, T0 + 3000, T0 + 9000]
    session = record(stub, "imp-1")
    assert session.create_time.ToNanoseconds() == T0
    assert session.last_append_time.ToNanoseconds() == T0 + 9000  # the last event's: unset
    assert (session.parent_session_id, session.parent_event_count) == ("imp-parent", 1)
    assert session.replace_generation == 1
    # An imported session takes appends like any other.
    append = pb.AppendRequest(session_id="imp-1", events=[user("d")])
    assert stub.Append(append, metadata=as_(WRITER), timeout=5).events[0].seq == 4


def test_an_empty_session_is_imported(stub: pb_grpc.SessionLogServiceStub) -> None:
    """A chunk without events creates the session with its times."""
    request = pb.ImportSessionRequest(
        session_id="imp-empty", create_time=stamp(T0), last_append_time=stamp(T0 + 5)
    )
    stub.ImportSession(request, metadata=as_(WRITER), timeout=5)
    session = record(stub, "imp-empty")
    assert (session.exists, session.event_count) == (True, 0)
    assert session.create_time.ToNanoseconds() == T0


def test_seqs_out_of_line_are_refused_and_change_nothing(
    stub: pb_grpc.SessionLogServiceStub,
) -> None:
    """Seqs that skip inside a chunk, a chunk past or before the next seq: refused."""
    stub.ImportSession(
        pb.ImportSessionRequest(session_id="imp-seq", events=[timed(0, "a", T0)]),
        metadata=as_(WRITER),
        timeout=5,
    )
    skipping = pb.ImportSessionRequest(
        session_id="imp-seq", first_seq=1, events=[timed(1, "b", T0), timed(3, "c", T0)]
    )
    error = failure(stub.ImportSession, skipping, metadata=as_(WRITER), timeout=5)
    check(error, grpc.StatusCode.INVALID_ARGUMENT, "IMPORT_SEQ_NOT_DENSE", index=1, seq=3)
    for first_seq in (0, 2):  # an overlap, a gap
        chunk = pb.ImportSessionRequest(
            session_id="imp-seq", first_seq=first_seq, events=[timed(first_seq, "x", T0)]
        )
        error = failure(stub.ImportSession, chunk, metadata=as_(WRITER), timeout=5)
        check(error, grpc.StatusCode.FAILED_PRECONDITION, "IMPORT_SEQ_MISMATCH", next_seq=1)
    fresh = pb.ImportSessionRequest(session_id="imp-new", first_seq=5, events=[timed(5, "x", T0)])
    error = failure(stub.ImportSession, fresh, metadata=as_(WRITER), timeout=5)
    check(error, grpc.StatusCode.FAILED_PRECONDITION, "IMPORT_SEQ_MISMATCH", next_seq=0)
    assert record(stub, "imp-seq").event_count == 1
    assert not record(stub, "imp-new").exists


def test_events_are_checked_as_append_checks_them(stub: pb_grpc.SessionLogServiceStub) -> None:
    """An unknown type, a replace pointing at the future: the Append reasons, nothing written."""
    bad_type = ev(99, content="a")
    future = replace(5, 6, "later")
    for events, reason in (([bad_type], "UNKNOWN_EVENT_TYPE"), ([future], "INVALID_SURFACE_OP")):
        request = pb.ImportSessionRequest(session_id="imp-bad", events=events)
        error = failure(stub.ImportSession, request, metadata=as_(WRITER), timeout=5)
        check(error, grpc.StatusCode.INVALID_ARGUMENT, reason, index=0)
    assert not record(stub, "imp-bad").exists


def test_a_session_not_made_by_an_import_is_refused(stub: pb_grpc.SessionLogServiceStub) -> None:
    """Importing onto a session created by an append: SESSION_ALREADY_EXISTS, at any seq."""
    stub.Append(
        pb.AppendRequest(session_id="imp-own", events=[user("a")]), metadata=as_(WRITER), timeout=5
    )
    for first_seq in (0, 1):
        request = pb.ImportSessionRequest(
            session_id="imp-own", first_seq=first_seq, events=[timed(first_seq, "b", T0)]
        )
        error = failure(stub.ImportSession, request, metadata=as_(WRITER), timeout=5)
        check(error, grpc.StatusCode.ALREADY_EXISTS, "SESSION_ALREADY_EXISTS", session_id="imp-own")
    assert record(stub, "imp-own").event_count == 1


def test_a_live_lease_holds_off_a_plain_import(stub: pb_grpc.SessionLogServiceStub) -> None:
    """A lease taken on the id before the import: LEASE_HELD, as for an append."""
    acquire = pb.AcquireLeaseRequest(session_id="imp-leased", holder="w", ttl=Duration(seconds=60))
    stub.AcquireLease(acquire, metadata=as_(WRITER), timeout=5)
    request = pb.ImportSessionRequest(session_id="imp-leased", events=[timed(0, "a", T0)])
    error = failure(stub.ImportSession, request, metadata=as_(WRITER), timeout=5)
    check(error, grpc.StatusCode.FAILED_PRECONDITION, "LEASE_HELD")
    assert not record(stub, "imp-leased").exists


def test_tenants_import_inside_their_prefix_only(stub: pb_grpc.SessionLogServiceStub) -> None:
    """A tenant token imports a plain session in its prefix, and is refused outside it."""
    inside = pb.ImportSessionRequest(session_id="tenant-a.imp", events=[timed(0, "a", T0)])
    stub.ImportSession(inside, metadata=as_(TENANT_A), timeout=5)
    assert record(stub, "tenant-a.imp").event_count == 1
    outside = pb.ImportSessionRequest(session_id="tenant-b.imp", events=[timed(0, "a", T0)])
    error = failure(stub.ImportSession, outside, metadata=as_(TENANT_A), timeout=5)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert not record(stub, "tenant-b.imp").exists


def test_a_moves_extras_need_admin_and_replay(stub: pb_grpc.SessionLogServiceStub) -> None:
    """Request records, a lease and its audit: refused to a writer, kept for an admin; a
    request record read from one session and imported with it replays its append."""
    appended = stub.Append(
        pb.AppendRequest(session_id="imp-src", events=[user("once")], request_id="r-1"),
        metadata=as_(WRITER),
        timeout=5,
    )
    lease = pb.AcquireLeaseRequest(session_id="imp-src", holder="w", ttl=Duration(seconds=600))
    held = stub.AcquireLease(lease, metadata=as_(WRITER), timeout=5).lease
    records_request = pb.GetSessionRecordsRequest(session_id="imp-src")
    error = failure(stub.GetSessionRecords, records_request, metadata=as_(WRITER), timeout=5)
    check(error, grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
    records = stub.GetSessionRecords(records_request, metadata=as_(ADMIN), timeout=5)
    assert [r.request_id for r in records.request_records] == ["r-1"]
    assert (records.lease.lease.holder, records.lease.lease.token) == ("w", held.token)

    copy = pb.ImportSessionRequest(
        session_id="imp-dst",
        events=stored(stub, "imp-src"),
        request_records=records.request_records,
        lease=records.lease,
    )
    error = failure(stub.ImportSession, copy, metadata=as_(WRITER), timeout=5)
    check(error, grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
    assert not record(stub, "imp-dst").exists
    stub.ImportSession(copy, metadata=as_(ADMIN), timeout=5)
    retry = pb.AppendRequest(
        session_id="imp-dst", events=[user("once")], request_id="r-1", lease_holder="w"
    )
    replayed = stub.Append(retry, metadata=as_(WRITER), timeout=5)
    assert (list(replayed.events), replayed.next_seq) == (list(appended.events), 1)
    assert record(stub, "imp-dst").event_count == 1
    assert record(stub, "imp-dst").lease.holder == "w"
    plain = pb.AppendRequest(session_id="imp-dst", events=[user("not the holder")])
    error = failure(stub.Append, plain, metadata=as_(WRITER), timeout=5)
    check(error, grpc.StatusCode.FAILED_PRECONDITION, "LEASE_HELD")


def test_an_import_replicates_byte_for_byte(tmp_path: Path) -> None:
    """Import chunks (with a move's extras, no auth here) reach a replica as they are: the
    events, the record, the request records and the lease read the same there."""
    from tests.e2e._replication_cluster import Cluster, wait_position
    from tests.e2e.test_replication import assert_same_data

    with Cluster(tmp_path) as nodes:
        primary = nodes.primary()
        replica = nodes.replica(primary, "replica-1")
        stub = primary.stub()
        stub.Append(pb.AppendRequest(session_id="src", events=[user("a")], request_id="r"))
        stub.AcquireLease(
            pb.AcquireLeaseRequest(session_id="src", holder="w", ttl=Duration(seconds=60))
        )
        records = stub.GetSessionRecords(pb.GetSessionRecordsRequest(session_id="src"))
        first = pb.ImportSessionRequest(
            session_id="copy", events=[timed(0, "a", T0)], create_time=stamp(T0)
        )
        stub.ImportSession(first, timeout=5)
        later = pb.ImportSessionRequest(
            session_id="copy",
            first_seq=1,
            events=[timed(1, "b", T0 + 1000)],
            request_records=records.request_records,
            lease=records.lease,
        )
        stub.ImportSession(later, timeout=5)
        wait_position(replica, primary.status().position, timeout=30)
        assert assert_same_data(primary, replica) == 2
        asked = pb.GetSessionRecordsRequest(session_id="copy")
        on_primary = stub.GetSessionRecords(asked, timeout=5)
        assert on_primary.request_records[0].request_id == "r"
        assert replica.stub().GetSessionRecords(asked, timeout=5) == on_primary


def test_imported_usage_is_in_the_ledger(stub: pb_grpc.SessionLogServiceStub) -> None:
    """Events that carry usage add to the imported session's totals, chunk by chunk, and an
    imported fork's copied part (seq < parent_event_count) counts as inherited, not its own."""

    def spent(seq: int, tokens: int) -> event_pb2.Event:
        event = timed(seq, f"m{seq}", T0 + seq)
        event.usage.model = "m-1"
        event.usage.input_tokens = tokens
        return event

    first = pb.ImportSessionRequest(
        session_id="imp-usage",
        events=[spent(0, 10), spent(1, 20)],
        parent_session_id="imp-usage-parent",
        parent_event_count=1,
    )
    stub.ImportSession(first, metadata=as_(WRITER), timeout=5)
    more = pb.ImportSessionRequest(session_id="imp-usage", first_seq=2, events=[spent(2, 5)])
    stub.ImportSession(more, metadata=as_(WRITER), timeout=5)
    reply = stub.GetUsage(
        pb.GetUsageRequest(session_id="imp-usage"), metadata=as_(ADMIN), timeout=5
    )
    assert [(u.model, u.input_tokens, u.event_count) for u in reply.usage] == [("m-1", 35, 3)]
    assert [(u.model, u.input_tokens, u.event_count) for u in reply.own_usage] == [("m-1", 25, 2)]
    at = stub.GetUsage(
        pb.GetUsageRequest(session_id="imp-usage", at_seq=1), metadata=as_(ADMIN), timeout=5
    )
    assert [(u.input_tokens, u.event_count) for u in at.usage] == [(30, 2)]


def test_a_redacted_event_imports_with_its_mark(stub: pb_grpc.SessionLogServiceStub) -> None:
    """An exported redacted session imports identically: the event keeps ``redacted``."""
    stub.Append(
        pb.AppendRequest(session_id="imp-red-src", events=[user("secret"), user("kept")]),
        metadata=as_(WRITER),
        timeout=5,
    )
    stub.RedactEvents(
        pb.RedactEventsRequest(session_id="imp-red-src", seqs=[0], reason="privacy"),
        metadata=as_(WRITER),
        timeout=5,
    )
    source = stored(stub, "imp-red-src")
    assert source[0].HasField("redacted")
    copied = pb.ImportSessionRequest(session_id="imp-red-copy", events=source)
    stub.ImportSession(copied, metadata=as_(WRITER), timeout=5)
    assert stored(stub, "imp-red-copy") == source


def test_the_record_is_kept_and_indexed(stub: pb_grpc.SessionLogServiceStub) -> None:
    """A record sent with the chunk: title, labels, owner and status read back, the session is
    listed by a label filter and by update time (its update_time as given, not the import's),
    and a later chunk's record replaces it."""
    record = pb.Session(title="moved", owner="ana", status="open", labels={"team": "core"})
    record.update_time.CopyFrom(stamp(T0 + 9000))
    first = pb.ImportSessionRequest(
        session_id="imp-rec", events=[timed(0, "a", T0 + 1000)], record=record
    )
    stub.ImportSession(first, metadata=as_(WRITER), timeout=5)
    got = stub.GetSession(
        pb.GetSessionRequest(session_id="imp-rec"), metadata=as_(ADMIN), timeout=5
    ).session
    assert (got.title, got.owner, got.status, dict(got.labels)) == (
        "moved",
        "ana",
        "open",
        {"team": "core"},
    )
    assert got.update_time.ToNanoseconds() == T0 + 9000
    by_label = stub.ListSessions(
        pb.ListSessionsRequest(filter='labels.team = "core"'), metadata=as_(ADMIN), timeout=5
    )
    assert "imp-rec" in [s.session_id for s in by_label.sessions]
    recent = stub.ListSessions(
        pb.ListSessionsRequest(order_by="update_time desc", page_size=1000),
        metadata=as_(ADMIN),
        timeout=5,
    )
    listed = [s for s in recent.sessions if s.session_id == "imp-rec"]
    assert [s.update_time.ToNanoseconds() for s in listed] == [T0 + 9000]
    later = pb.Session(title="renamed", labels={"team": "ops"})
    more = pb.ImportSessionRequest(
        session_id="imp-rec", first_seq=1, events=[timed(1, "b", T0 + 2000)], record=later
    )
    stub.ImportSession(more, metadata=as_(WRITER), timeout=5)
    record_of = stub.GetSession(
        pb.GetSessionRequest(session_id="imp-rec"), metadata=as_(ADMIN), timeout=5
    ).session
    assert (record_of.title, dict(record_of.labels), record_of.owner) == (
        "renamed",
        {"team": "ops"},
        "",
    )
    old_label = stub.ListSessions(
        pb.ListSessionsRequest(filter='labels.team = "core"'), metadata=as_(ADMIN), timeout=5
    )
    assert "imp-rec" not in [s.session_id for s in old_label.sessions]
    recent = stub.ListSessions(
        pb.ListSessionsRequest(order_by="update_time desc", page_size=1000),
        metadata=as_(ADMIN),
        timeout=5,
    )
    assert [s.session_id for s in recent.sessions].count("imp-rec") == 1
    bad = pb.ImportSessionRequest(
        session_id="imp-rec-bad", record=pb.Session(labels={"bad key!": "x"})
    )
    error = failure(stub.ImportSession, bad, metadata=as_(WRITER), timeout=5)
    check(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SESSION_FIELD")
    assert "imp-rec-bad" not in [s.session_id for s in recent.sessions]


HOUR_NS = 3600 * 1_000_000_000


def lease_record(acquired: int, expires: int) -> pb.SessionLeaseRecord:
    lease = pb.Lease(holder="w", token=1, acquire_time=stamp(acquired), expire_time=stamp(expires))
    return pb.SessionLeaseRecord(lease=lease)


def request_record(first_seq: int, count: int, next_seq: int, ns: int) -> pb.SessionRequestRecord:
    return pb.SessionRequestRecord(
        request_id="r", first_seq=first_seq, event_count=count, next_seq=next_seq, time=stamp(ns)
    )


def inconsistent() -> list[tuple[str, dict[str, object], str]]:
    """(what, the ImportSessionRequest fields of a two-event chunk, the field named)."""
    now = time.time_ns()
    future = now + 2 * 24 * HOUR_NS
    return [
        (
            "lease expiring before it was taken",
            {"lease": lease_record(T0, T0 - 1)},
            "lease.expire_time",
        ),
        (
            "lease past the longest TTL",
            {"lease": lease_record(now, now + 30 * 24 * HOUR_NS)},
            "lease.expire_time",
        ),
        (
            "lease taken in the future",
            {"lease": lease_record(future, future + HOUR_NS)},
            "lease.acquire_time",
        ),
        (
            "request record past the events",
            {"request_records": [request_record(2, 1, 3, T0)]},
            "request_records.next_seq",
        ),
        (
            "request record ending past its next seq",
            {"request_records": [request_record(0, 2, 1, T0)]},
            "request_records.next_seq",
        ),
        (
            "request record in the future",
            {"request_records": [request_record(0, 2, 2, future)]},
            "request_records.time",
        ),
        (
            "audit entry in the future",
            {
                "lease_audit": [
                    pb.LeaseAuditEntry(
                        kind=pb.LEASE_AUDIT_KIND_TAKEOVER,
                        actor="b",
                        previous_holder="a",
                        time=stamp(future),
                    )
                ]
            },
            "lease_audit.time",
        ),
        (
            "last append before create",
            {"create_time": stamp(T0), "last_append_time": stamp(T0 - 1)},
            "last_append_time",
        ),
        ("create time in the future", {"create_time": stamp(future)}, "create_time"),
        (
            "last append in the future",
            {"create_time": stamp(T0), "last_append_time": stamp(future)},
            "last_append_time",
        ),
        (
            "record updated in the future",
            {"record": pb.Session(title="t", update_time=stamp(future))},
            "record.update_time",
        ),
        (
            "expiry past the year 2554 (beyond a 64-bit ns)",
            {"record": pb.Session(expire_time=Timestamp(seconds=253402300799))},
            "record.expire_time",
        ),
        (
            "a create time that is not a Timestamp",
            {"create_time": Timestamp(seconds=T0 // 10**9, nanos=-1)},
            "create_time",
        ),
    ]


def test_inconsistent_records_are_refused_and_write_nothing(
    stub: pb_grpc.SessionLogServiceStub,
) -> None:
    """A lease expiring before it was taken or past the longest TTL, a request record past the
    session's events, a last append before the create, a far-future time: INVALID_IMPORT
    naming the field, and no session."""
    for n, (what, fields, field) in enumerate(inconsistent()):
        session_id = f"imp-inconsistent-{n}"
        events = [timed(0, "a", T0), timed(1, "b", T0 + 1000)]
        request = pb.ImportSessionRequest(session_id=session_id, events=events)
        for name, value in fields.items():
            if isinstance(value, list):
                getattr(request, name).extend(value)
            else:
                getattr(request, name).CopyFrom(value)
        error = failure(stub.ImportSession, request, metadata=as_(ADMIN), timeout=5)
        check(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_IMPORT", field=field)
        assert not record(stub, session_id).exists, what


def test_a_later_chunks_last_append_is_checked_against_the_stored_create(
    stub: pb_grpc.SessionLogServiceStub,
) -> None:
    """A second chunk whose last_append_time is before the create time the first chunk
    stored: INVALID_IMPORT, and the session stays as it was."""
    first = pb.ImportSessionRequest(
        session_id="imp-late", events=[timed(0, "a", T0)], create_time=stamp(T0)
    )
    stub.ImportSession(first, metadata=as_(WRITER), timeout=5)
    second = pb.ImportSessionRequest(
        session_id="imp-late",
        first_seq=1,
        events=[timed(1, "b", T0 + 1000)],
        last_append_time=stamp(T0 - 1000),
    )
    error = failure(stub.ImportSession, second, metadata=as_(WRITER), timeout=5)
    check(error, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_IMPORT", field="last_append_time")
    assert record(stub, "imp-late").event_count == 1


def test_consistent_records_at_their_bounds_are_taken(stub: pb_grpc.SessionLogServiceStub) -> None:
    """A renewed lease (taken long ago, expiring within the TTL), a request record ending at
    the chunk's last event, a last append equal to the create time: all kept."""
    now = time.time_ns()
    request = pb.ImportSessionRequest(
        session_id="imp-bounds",
        events=[timed(0, "a", T0), timed(1, "b", T0)],
        create_time=stamp(T0),
        last_append_time=stamp(T0),
        request_records=[request_record(0, 2, 2, now)],
        lease=lease_record(T0, now + 23 * HOUR_NS),
    )
    stub.ImportSession(request, metadata=as_(ADMIN), timeout=5)
    records = stub.GetSessionRecords(
        pb.GetSessionRecordsRequest(session_id="imp-bounds"), metadata=as_(ADMIN), timeout=5
    )
    assert [r.next_seq for r in records.request_records] == [2]
    assert records.lease.lease.acquire_time.ToNanoseconds() == T0
