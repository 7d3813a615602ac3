"""Session records beyond one server and its tests: a replica holds the same records and indexes
(byte-identical listings in every order), a tenant's token keeps UpdateSession, listing and
children inside its prefix, a primary indexes an older server's sessions at start, and the
records bench (case 11) runs at a small size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
from google.protobuf.field_mask_pb2 import FieldMask

from sessionlog.storage.store import Store
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import check, failure
from tests.e2e._proc import running_server
from tests.e2e._replication_cluster import Cluster, get_session_raw, wait_position
from tests.e2e.test_auth import TENANT_A, WRITER, bearer, tokens_file


def listing(stub: object, **fields: object) -> list[bytes]:
    """Every page of a listing as the bytes the server sent."""
    pages: list[bytes] = []
    token = ""
    while True:
        request = pb.ListSessionsRequest(page_size=3, page_token=token, **fields)  # type: ignore[arg-type]
        reply = stub.ListSessions(request, timeout=10)  # type: ignore[attr-defined]
        pages.append(reply.SerializeToString(deterministic=True))
        token = reply.next_page_token
        if not token:
            return pages


def test_a_replica_lists_and_describes_records_as_its_primary(tmp_path: Path) -> None:
    """Creates with labels, children, updates (label removals included) and appends reach a
    replica: GetSession and every listing order and filter answer the same bytes."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        replica = cluster.replica(primary, "replica")
        stub = primary.stub()
        for i in range(8):
            labels = {"team": "core" if i % 2 else "web", f"k{i}": "v"}
            stub.CreateSession(
                pb.CreateSessionRequest(session_id=f"r{i}", labels=labels, owner=f"o{i % 3}"),
                timeout=10,
            )
        stub.CreateSession(
            pb.CreateSessionRequest(session_id="r-kid", parent_session_id="r1", title="kid"),
            timeout=10,
        )
        removal = pb.UpdateSessionRequest(
            session=pb.Session(session_id="r3", labels={}, status="done"),
            update_mask=FieldMask(paths=["labels.team", "status"]),
        )
        stub.UpdateSession(removal, timeout=10)
        stub.Append(pb.AppendRequest(session_id="r2", events=[]), timeout=10)
        wait_position(replica, primary.status().position)
        asks = [
            {},
            {"order_by": "update_time desc"},
            {"filter": 'labels.team = "core"'},
            {"filter": "labels.team:*", "order_by": "update_time desc"},
            {"filter": 'parent = "r1"'},
            {"filter": 'status = "done"'},
        ]
        replica_stub = replica.stub()
        for ask in asks:
            assert listing(replica_stub, **ask) == listing(stub, **ask), ask
        core = [
            s.session_id
            for s in pb.ListSessionsResponse.FromString(
                listing(replica_stub, filter='labels.team = "core"')[0]
            ).sessions
        ]
        assert core == ["r1", "r5", "r7"]  # r3 lost its team label
        refused = failure(replica_stub.UpdateSession, removal, timeout=10)
        check(refused, grpc.StatusCode.FAILED_PRECONDITION, "NOT_PRIMARY")
        for session_id in ("r3", "r-kid"):
            assert get_session_raw(replica.channel, session_id) == get_session_raw(
                primary.channel, session_id
            )


def test_a_tenant_updates_and_lists_only_inside_its_prefix(tmp_path: Path) -> None:
    """UpdateSession and a child's parent outside the token's prefix are PERMISSION_DENIED; its
    listings, filtered or ordered by update time, show its own sessions only."""
    tokens = tokens_file(tmp_path / "tokens.toml")
    with running_server(tmp_path / "data", auth_tokens=str(tokens)) as server:
        stub = server.stub()
        for session_id in ("tenant-a.1", "tenant-b.1"):
            stub.CreateSession(
                pb.CreateSessionRequest(session_id=session_id, labels={"x": "y"}),
                metadata=bearer(WRITER),
            )
        tenant = bearer(TENANT_A)
        other = pb.UpdateSessionRequest(session=pb.Session(session_id="tenant-b.1", title="mine"))
        check(
            failure(stub.UpdateSession, other, metadata=tenant),
            grpc.StatusCode.PERMISSION_DENIED,
            "PERMISSION_DENIED",
        )
        own = pb.UpdateSessionRequest(session=pb.Session(session_id="tenant-a.1", title="mine"))
        assert stub.UpdateSession(own, metadata=tenant).session.title == "mine"
        child = pb.CreateSessionRequest(session_id="tenant-a.kid", parent_session_id="tenant-b.1")
        check(
            failure(stub.CreateSession, child, metadata=tenant),
            grpc.StatusCode.PERMISSION_DENIED,
            "PERMISSION_DENIED",
        )
        for ask in ({"filter": "labels.x = y"}, {"order_by": "update_time desc"}):
            reply = stub.ListSessions(pb.ListSessionsRequest(**ask), metadata=tenant)  # type: ignore[arg-type]
            assert [s.session_id for s in reply.sessions] == ["tenant-a.1"]
        described = stub.GetSession(
            pb.GetSessionRequest(session_id="tenant-b.1"), metadata=bearer(WRITER)
        ).session
        assert described.title == ""


def test_the_records_bench_runs_and_checks_its_listings(tmp_path: Path) -> None:
    """`python -m bench.records` at a small size: every row lists what its filter selects."""
    out = tmp_path / "records.json"
    argv = ["--sessions", "300", "--page-size", "50", "--json", str(out)]
    result = subprocess.run(
        [sys.executable, "-m", "bench.records", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["listed"] for row in rows] == [300, 30, 6, 3, 300, 270, 30]
    assert all(not row["error"] for row in rows)
    assert "by id (today's listing)" in result.stdout


def test_a_primary_indexes_an_older_servers_sessions_at_start(tmp_path: Path) -> None:
    """A folder whose sessions lack their update-time entries (written before the index) lists
    them all newest first once a primary has started on it."""
    data = tmp_path / "data"
    store = Store(data)
    for name in ("old.a", "old.b", "old.c"):
        store.append(name, [event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)])
    with store.env.begin(write=True) as txn:
        txn.drop(store.tables.recent, delete=False)
    store.close()
    with running_server(data) as server:
        reply = server.stub().ListSessions(pb.ListSessionsRequest(order_by="update_time desc"))
        assert [s.session_id for s in reply.sessions] == ["old.c", "old.b", "old.a"]
