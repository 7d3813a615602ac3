"""Every reply that carries a Session describes the session as stored (issue 29, items 4 and 6).

Item 4: the Session of a write's reply is GetSession's Session for the same stored state (the
record and the live lease included), less ``usage``, which only reads carry. Item 6: a create,
seed or fork retried with its request_id answers exactly what the first call answered, even
after the session was appended to, updated and its lease renewed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import duration_pb2, field_mask_pb2

from sessionlog.testing import RunningServer
from sessionlog.v1 import message_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import ASSISTANT, Stub, append, get, say, user
from tests.e2e._proc import running_server
from tests.e2e._replication_cluster import Cluster, wait_position

Role = message_pb2.Role
HOUR = duration_pb2.Duration(seconds=3600)


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("replies") / "data") as running:
        yield running


@pytest.fixture
def stub(module_server: RunningServer) -> Stub:
    return module_server.stub()


def without_usage(session: pb.Session) -> pb.Session:
    """The Session less its usage (only GetSession and ListSessions report usage)."""
    copy = pb.Session()
    copy.CopyFrom(session)
    copy.ClearField("usage")
    return copy


def assert_as_stored(reply: pb.Session, stub: Stub) -> None:
    """``reply`` is what GetSession says of the same session now, field for field."""
    stored = without_usage(get(stub, reply.session_id))
    assert without_usage(reply) == stored


def lease(stub: Stub, session_id: str, holder: str) -> None:
    stub.AcquireLease(pb.AcquireLeaseRequest(session_id=session_id, holder=holder, ttl=HOUR))


def owned(session_id: str, request_id: str = "") -> pb.CreateSessionRequest:
    """A create with every person-set field, a ttl and a pin."""
    return pb.CreateSessionRequest(
        session_id=session_id,
        events=[say("a"), say("b", ASSISTANT)],
        title="Trip",
        labels={"team": "blue"},
        owner="ann",
        status="active",
        ttl=HOUR,
        pinned=True,
        request_id=request_id,
    )


def update_title(stub: Stub, session_id: str, title: str) -> None:
    stub.UpdateSession(
        pb.UpdateSessionRequest(
            session=pb.Session(session_id=session_id, title=title),
            update_mask=field_mask_pb2.FieldMask(paths=["title"]),
        )
    )


# -- item 4: replies describe the session as stored ---------------------------------------------


def test_create_reply_is_the_stored_session_lease_included(stub: Stub) -> None:
    """CreateSession's Session is GetSession's, the record and the lease taken first included."""
    lease(stub, "r-create", "w1")
    request = owned("r-create")
    request.lease_holder = "w1"
    reply = stub.CreateSession(request).session
    assert reply.owner == "ann"
    assert reply.pinned
    assert reply.HasField("expire_time")
    assert reply.lease.holder == "w1"
    assert_as_stored(reply, stub)


def test_fork_reply_is_the_stored_session(stub: Stub) -> None:
    """A fork of ann's session replies owner "ann", as GetSession says (it replied "")."""
    stub.CreateSession(owned("r-parent"))
    lease(stub, "r-child", "w2")
    reply = stub.ForkSession(
        pb.ForkSessionRequest(parent_session_id="r-parent", session_id="r-child", lease_holder="w2")
    ).session
    assert reply.owner == "ann"
    assert reply.lease.holder == "w2"
    assert_as_stored(reply, stub)


def test_seed_reply_is_the_stored_session(stub: Stub) -> None:
    lease(stub, "r-seed", "w3")
    seeded = stub.SeedSession(
        pb.SeedSessionRequest(
            session_id="r-seed",
            messages=[message_pb2.Message(role=Role.ROLE_USER, content="hi")],
            lease_holder="w3",
        )
    )
    assert seeded.session.lease.holder == "w3"
    assert_as_stored(seeded.session, stub)


def test_update_list_and_records_describe_the_session_as_get_does(stub: Stub) -> None:
    """UpdateSession's reply, a ListSessions entry and GetSessionRecords' session."""
    stub.CreateSession(owned("r-update"))
    lease(stub, "r-update", "w4")
    update_title(stub, "r-update", "Renamed")
    reply = stub.UpdateSession(
        pb.UpdateSessionRequest(
            session=pb.Session(session_id="r-update", status="done"),
            update_mask=field_mask_pb2.FieldMask(paths=["status"]),
        )
    ).session
    assert reply.title == "Renamed"
    assert reply.status == "done"
    assert_as_stored(reply, stub)
    listed = stub.ListSessions(pb.ListSessionsRequest(prefix="r-update")).sessions
    assert [s.session_id for s in listed] == ["r-update"]
    assert listed[0] == get(stub, "r-update")  # usage too: both are reads
    records = stub.GetSessionRecords(pb.GetSessionRecordsRequest(session_id="r-update"))
    assert records.session.lease.holder == "w4"
    assert_as_stored(records.session, stub)


def test_import_reply_is_the_stored_session(stub: Stub) -> None:
    record = pb.Session(title="Imported", labels={"k": "v"}, owner="bob", status="active")
    reply = stub.ImportSession(
        pb.ImportSessionRequest(session_id="r-import", events=[user("x")], record=record)
    ).session
    assert reply.owner == "bob"
    assert reply.title == "Imported"
    assert_as_stored(reply, stub)


def test_delete_reply_is_the_session_as_it_was_just_before(stub: Stub) -> None:
    stub.CreateSession(owned("r-delete"))
    lease(stub, "r-delete", "w5")
    before = without_usage(get(stub, "r-delete"))
    reply = stub.DeleteSession(
        pb.DeleteSessionRequest(session_id="r-delete", lease_holder="w5")
    ).session
    assert reply.owner == "ann"
    assert reply.lease.holder == "w5"
    assert reply == before
    assert not get(stub, "r-delete").exists


# -- item 6: a retry answers what the first call answered -------------------------------------


def change_everything(stub: Stub, session_id: str, holder: str) -> None:
    """What a session may go through between a call and its retry."""
    append(stub, session_id, user("later"), lease_holder=holder)
    update_title(stub, session_id, "Changed since")
    lease(stub, session_id, holder)  # renewed: a later expire_time


def test_create_retry_answers_the_first_reply(stub: Stub) -> None:
    lease(stub, "r6-create", "w6")
    request = owned("r6-create", request_id="create-once")
    request.lease_holder = "w6"
    first = stub.CreateSession(request)
    change_everything(stub, "r6-create", "w6")
    assert get(stub, "r6-create").event_count == 3
    again = stub.CreateSession(request)
    assert again.session.event_count == 2
    assert again.SerializeToString() == first.SerializeToString()


def test_seed_retry_answers_the_first_reply(stub: Stub) -> None:
    lease(stub, "r6-seed", "w7")
    request = pb.SeedSessionRequest(
        session_id="r6-seed",
        messages=[message_pb2.Message(role=Role.ROLE_USER, content="hi")],
        lease_holder="w7",
        request_id="seed-once",
    )
    first = stub.SeedSession(request)
    change_everything(stub, "r6-seed", "w7")
    again = stub.SeedSession(request)
    assert again.session.event_count == 1
    assert again.SerializeToString() == first.SerializeToString()


def test_fork_retry_answers_the_first_reply(stub: Stub) -> None:
    stub.CreateSession(owned("r6-parent"))
    lease(stub, "r6-child", "w8")
    request = pb.ForkSessionRequest(
        parent_session_id="r6-parent",
        session_id="r6-child",
        lease_holder="w8",
        request_id="fork-once",
    )
    first = stub.ForkSession(request)
    change_everything(stub, "r6-child", "w8")
    again = stub.ForkSession(request)
    assert again.session.event_count == 2
    assert again.SerializeToString() == first.SerializeToString()


def test_fork_retry_with_a_generated_id_answers_the_first_reply(stub: Stub) -> None:
    stub.CreateSession(owned("r6-parent2"))
    request = pb.ForkSessionRequest(parent_session_id="r6-parent2", request_id="fork-gen")
    first = stub.ForkSession(request)
    child = first.session.session_id
    append(stub, child, user("later"))
    again = stub.ForkSession(request)
    assert again.SerializeToString() == first.SerializeToString()
    assert get(stub, child).event_count == 3


def test_a_retry_after_a_move_replays_and_describes_the_session_now(stub: Stub) -> None:
    """A request record carried by ImportSession (as a slot move carries it) holds no Session:
    the retry still replays the first events, and describes the session as it is now."""
    request = owned("r6-moved", request_id="create-moved")
    first = stub.CreateSession(request)
    as_it_was = get(stub, "r6-moved")
    records = stub.GetSessionRecords(pb.GetSessionRecordsRequest(session_id="r6-moved"))
    assert [r.request_id for r in records.request_records] == ["create-moved"]
    stub.DeleteSession(pb.DeleteSessionRequest(session_id="r6-moved"))
    stub.ImportSession(
        pb.ImportSessionRequest(
            session_id="r6-moved",
            events=first.events,
            create_time=as_it_was.create_time,
            last_append_time=as_it_was.last_append_time,
            request_records=records.request_records,
            record=as_it_was,
        )
    )
    append(stub, "r6-moved", user("later"))
    again = stub.CreateSession(request)
    assert list(again.events) == list(first.events)
    assert again.session.event_count == 3
    assert_as_stored(again.session, stub)


def test_a_promoted_replica_answers_a_retry_with_the_first_reply(tmp_path: Path) -> None:
    """The answer travels in the request record, which the change feed replicates: after a
    failover, the new primary answers a retried create, seed and fork as the old one first did."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary("a")
        replica = cluster.replica(primary, "b")
        stub = primary.stub()
        lease(stub, "f-create", "w9")
        create = owned("f-create", request_id="create-f")
        create.lease_holder = "w9"
        seed = pb.SeedSessionRequest(
            session_id="f-seed",
            messages=[message_pb2.Message(role=Role.ROLE_USER, content="hi")],
            request_id="seed-f",
        )
        fork = pb.ForkSessionRequest(parent_session_id="f-create", request_id="fork-f")
        firsts = [
            stub.CreateSession(create, timeout=10),
            stub.SeedSession(seed, timeout=10),
            stub.ForkSession(fork, timeout=10),
        ]
        for reply in firsts:
            session_id = reply.session.session_id
            holder = "w9" if session_id == "f-create" else ""
            append(stub, session_id, user("later"), lease_holder=holder)
        update_title(stub, "f-create", "Changed since")
        wait_position(replica, primary.status().position)
        primary.kill()
        replica.stop()
        replica.replica_of = ""
        replica.start()
        promoted = replica.stub()
        agains = [
            promoted.CreateSession(create, timeout=10),
            promoted.SeedSession(seed, timeout=10),
            promoted.ForkSession(fork, timeout=10),
        ]
        for first, again in zip(firsts, agains, strict=True):
            assert again.SerializeToString() == first.SerializeToString()
        assert get(promoted, "f-create").event_count == 3
