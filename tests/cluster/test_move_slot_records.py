"""`sessionlog cluster move-slot` carries the whole session, not only its events: the record's
times and fork parent, the request records (a retried append replays at the new owner), the
writer lease (its holder keeps writing with its token) and empty sessions.

One move of one slot holding a session of each kind, against the module-scoped cluster of
``test_move_slot`` (one etcd, groups g1 and g2), started once for this module.
"""

from __future__ import annotations

import grpc
from google.protobuf.duration_pb2 import Duration

from sessionlog.shard import move
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.cluster import test_move_slot as base
from tests.cluster.test_move_slot import Cluster, ids_of_slot
from tests.e2e._helpers import check, failure, get, log, user
from tests.e2e._proc import run_cli

cluster = base.cluster  # the same fixture: a cluster of this module's own


def _session(stub: object, session_id: str) -> pb.GetSessionResponse:
    reply: pb.GetSessionResponse = stub.GetSession(  # type: ignore[attr-defined]
        pb.GetSessionRequest(session_id=session_id), timeout=5
    )
    return reply


def test_a_move_carries_records_requests_leases_and_empty_sessions(cluster: Cluster) -> None:
    """Times, parent, request replays, a held lease and an empty session all survive a move."""
    before = cluster.map()
    slot = before.group("g1").ranges[0][0] + 41
    full, forked, empty, leased, retried = ids_of_slot(slot, 5, "rec-")
    g1 = cluster.stub("g1")
    g1.CreateSession(pb.CreateSessionRequest(session_id=full, events=[user("a")]), timeout=5)
    g1.Append(pb.AppendRequest(session_id=full, events=[user("b"), user("c")]), timeout=5)
    g1.ForkSession(
        pb.ForkSessionRequest(parent_session_id=full, session_id=forked, at_seq=1), timeout=5
    )
    g1.Append(pb.AppendRequest(session_id=forked, events=[user("d")]), timeout=5)
    g1.CreateSession(pb.CreateSessionRequest(session_id=empty), timeout=5)
    lease = g1.AcquireLease(
        pb.AcquireLeaseRequest(session_id=leased, holder="worker-1", ttl=Duration(seconds=600)),
        timeout=5,
    ).lease
    g1.Append(
        pb.AppendRequest(
            session_id=leased, events=[user("mine")], lease_holder="worker-1",
            lease_token=lease.token,
        ),
        timeout=5,
    )  # fmt: skip
    asked = pb.AppendRequest(session_id=retried, events=[user("once")], request_id="req-7")
    first = g1.Append(asked, timeout=5)
    g1.Append(pb.AppendRequest(session_id=retried, events=[user("after")]), timeout=5)
    held = {s: _session(g1, s) for s in (full, forked, empty, leased, retried)}
    events = {s: log(g1, s) for s in (full, forked, leased, retried)}

    done = run_cli(
        ["cluster", "move-slot", str(slot), "--to", "g2", "--cluster", cluster.cluster],
        cluster.etcd.directory,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 session(s)" in done.stdout, done.stdout
    assert cluster.map().owner_of_slot(slot).name == "g2"

    g2 = cluster.stub("g2")
    for session_id, was in held.items():
        now = _session(g2, session_id)
        assert now.session == was.session, session_id  # times, parent, counts, live lease
        assert list(now.lease_audit) == list(was.lease_audit)
    assert get(g2, forked).parent_session_id == full
    assert get(g2, forked).parent_event_count == 2
    assert get(g2, empty).exists
    assert get(g2, empty).event_count == 0
    for session_id, stored in events.items():
        assert log(g2, session_id) == stored, session_id

    # The append acknowledged before the move, retried at the new owner: its first result.
    replayed = g2.Append(asked, timeout=5)
    assert (list(replayed.events), replayed.next_seq) == (list(first.events), first.next_seq)
    assert get(g2, retried).event_count == 2  # nothing written again
    other = pb.AppendRequest(session_id=retried, events=[user("other")], request_id="req-7")
    check(
        failure(g2.Append, other, timeout=5), grpc.StatusCode.INVALID_ARGUMENT, "REQUEST_ID_REUSED"
    )

    # The lease holder keeps writing with its token; anyone else is held off.
    mine = pb.AppendRequest(
        session_id=leased, events=[user("still mine")], lease_holder="worker-1",
        lease_token=lease.token,
    )  # fmt: skip
    assert g2.Append(mine, timeout=5).events[0].seq == 1
    theirs = pb.AppendRequest(session_id=leased, events=[user("theirs")])
    check(failure(g2.Append, theirs, timeout=5), grpc.StatusCode.FAILED_PRECONDITION, "LEASE_HELD")
    renewed = g2.RenewLease(
        pb.RenewLeaseRequest(session_id=leased, holder="worker-1", ttl=Duration(seconds=60)),
        timeout=5,
    )
    assert renewed.lease.token == lease.token

    # And back: g1 still holds its old copies of the sessions; the move back erases them first
    # and copies g2's whole sessions, what g2 added included.
    g2.Append(pb.AppendRequest(session_id=full, events=[user("at g2")]), timeout=5)
    held = {s: _session(g2, s) for s in (full, forked, empty, leased, retried)}
    at_g2 = log(g2, full)
    done = run_cli(
        ["cluster", "move-slot", str(slot), "--to", "g1", "--cluster", cluster.cluster],
        cluster.etcd.directory,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for session_id, was in held.items():
        assert _session(g1, session_id).session == was.session, session_id
    assert log(g1, full) == at_g2
    assert len(at_g2) == 4
    assert g1.Append(mine, timeout=5).events[0].seq == 2  # the holder writes on at g1


def test_an_import_copy_is_refused_where_the_slot_is_owned(cluster: Cluster) -> None:
    """The move's ImportSession only fills a group that does not own the slot yet."""
    current = cluster.map()
    (owned,) = ids_of_slot(current.group("g2").ranges[0][0], 1, "imp-")
    request = pb.ImportSessionRequest(session_id=owned, events=[user("x")])
    error = failure(
        cluster.stub("g2").ImportSession, request, metadata=(("x-sessionlog-move", "copy"),),
        timeout=5,
    )  # fmt: skip
    check(error, grpc.StatusCode.FAILED_PRECONDITION, "SLOT_OWNED", session_id=owned, group="g2")
    assert not get(cluster.stub("g2"), owned).exists


def test_records_changed_after_an_earlier_copy_are_carried(cluster: Cluster) -> None:
    """A copy made earlier (an interrupted move's), then a request, a forced release and a new
    holder at the source: the move erases that copy, copies afresh and carries the records as
    they are."""
    current = cluster.map()
    slot = current.group("g1").ranges[0][0] + 57
    (session,) = ids_of_slot(slot, 1, "late-")
    g1, g2 = cluster.stub("g1"), cluster.stub("g2")
    g1.Append(pb.AppendRequest(session_id=session, events=[user("a"), user("b")]), timeout=5)
    ttl = Duration(seconds=600)
    g1.AcquireLease(pb.AcquireLeaseRequest(session_id=session, holder="w1", ttl=ttl), timeout=5)
    with move._Groups(current, "") as groups:
        earlier = move._Copier(groups, current.group("g1"), current.group("g2"), slot, print)
        assert earlier.copy_all() == 2
    not_yet = failure(g2.GetSession, pb.GetSessionRequest(session_id=session), timeout=5)
    check(not_yet, grpc.StatusCode.FAILED_PRECONDITION, "WRONG_GROUP")  # a copy, not served

    release = pb.ReleaseLeaseRequest(session_id=session, holder="operator", force=True)
    g1.ReleaseLease(release, timeout=5)
    lease = g1.AcquireLease(
        pb.AcquireLeaseRequest(session_id=session, holder="w2", ttl=ttl), timeout=5
    ).lease
    asked = pb.AppendRequest(
        session_id=session, events=[user("late")], request_id="late-1", lease_holder="w2"
    )
    first = g1.Append(asked, timeout=5)
    was = _session(g1, session)
    assert len(was.lease_audit) == 1

    done = run_cli(
        ["cluster", "move-slot", str(slot), "--to", "g2", "--cluster", cluster.cluster],
        cluster.etcd.directory,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "erased 1 stale copies" in done.stdout, done.stdout
    assert "3 event(s) copied live" in done.stdout, done.stdout
    now = _session(g2, session)
    assert now.session == was.session
    assert list(now.lease_audit) == list(was.lease_audit)
    replayed = g2.Append(asked, timeout=5)
    assert (list(replayed.events), replayed.next_seq) == (list(first.events), 3)
    assert now.session.lease.token == lease.token
    lost = pb.AppendRequest(session_id=session, events=[user("old holder")], lease_holder="w1")
    check(failure(g2.Append, lost, timeout=5), grpc.StatusCode.FAILED_PRECONDITION, "LEASE_LOST")
    assert get(g2, session).event_count == 3


def test_a_session_deleted_or_recreated_since_an_earlier_move_does_not_come_back(
    cluster: Cluster,
) -> None:
    """g1's copies outlive a move to g2; a session deleted at g2, and one deleted and written
    again, must not come back from them when the slot moves back to g1 (each move starts by
    erasing the target's copies of the slot). Erasing the copies of an owned slot is refused,
    SLOT_OWNED, and erases nothing."""
    from sessionlog.v1 import admin_service_pb2 as apb
    from sessionlog.v1 import admin_service_pb2_grpc as apb_grpc

    slot = cluster.map().group("g1").ranges[0][0] + 73
    gone, renewed = ids_of_slot(slot, 2, "del-")
    g1, g2 = cluster.stub("g1"), cluster.stub("g2")
    g1.Append(pb.AppendRequest(session_id=gone, events=[user("gone")]), timeout=5)
    g1.Append(pb.AppendRequest(session_id=renewed, events=[user("o1"), user("o2")]), timeout=5)

    def move_to(group: str) -> str:
        done = run_cli(
            ["cluster", "move-slot", str(slot), "--to", group, "--cluster", cluster.cluster],
            cluster.etcd.directory,
            timeout=90,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    move_to("g2")
    admin = apb_grpc.AdminServiceStub(cluster.channel("g2"))  # type: ignore[no-untyped-call]
    refused = failure(admin.EraseSessions, apb.EraseSessionsRequest(slot_copies=slot), timeout=5)
    check(refused, grpc.StatusCode.FAILED_PRECONDITION, "SLOT_OWNED", slot=slot)
    assert get(g2, gone).exists
    g2.DeleteSession(pb.DeleteSessionRequest(session_id=gone), timeout=5)
    g2.DeleteSession(pb.DeleteSessionRequest(session_id=renewed), timeout=5)
    g2.Append(pb.AppendRequest(session_id=renewed, events=[user("new")]), timeout=5)
    said = move_to("g1")
    assert "erased 2 stale copies" in said, said
    assert not get(g1, gone).exists
    assert [e.data["content"] for e in log(g1, renewed)] == ["new"]
    listed = g1.ListSessions(pb.ListSessionsRequest(prefix="del-"), timeout=5)
    assert [s.session_id for s in listed.sessions] == [renewed]
