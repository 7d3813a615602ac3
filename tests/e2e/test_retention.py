"""Retention end to end: a ttl'd session is deleted by the sweeper (NOT_FOUND-free GetSession
says it is gone, the erasure audit names it "expired"), a pinned one stays until unpinned, an
extended one stays, the idle policy deletes idle sessions and keeps active ones, bad input is
INVALID_EXPIRATION and changes nothing, a tenant sets expiry on its own sessions only, the
Python clients and the CLI set all three fields, and a replica erases an expired session too.

One server with a fast sweep for the module, one with the idle policy, one with auth; the
replica test starts its own pair.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp

from sessionlog.testing import RunningServer
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog_client import AsyncClient, Client
from tests.e2e._helpers import append, check, failure, get, user
from tests.e2e._proc import run_cli, run_cli_here, running_server
from tests.e2e._replication_cluster import Cluster, since_raw, wait_position
from tests.e2e.test_auth import TENANT_A, WRITER, bearer, tokens_file

INVALID = grpc.StatusCode.INVALID_ARGUMENT
SWEEP = 0.2
"""Seconds between sweeps on the module's servers."""


def ttl(seconds: float) -> Duration:
    duration = Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration


def at(seconds_from_now: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(time.time_ns() + round(seconds_from_now * 1e9))
    return stamp


def eventually(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def update(stub: Any, session: pb.Session, *paths: str, **call: Any) -> pb.Session:
    request = pb.UpdateSessionRequest(session=session, update_mask=FieldMask(paths=list(paths)))
    reply: pb.UpdateSessionResponse = stub.UpdateSession(request, timeout=10, **call)
    return reply.session


def audit(data: Path) -> list[dict[str, Any]]:
    done = run_cli(["admin", "erasures", "--json", "--data", str(data)], cwd=data.parent)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("retention") / "data"


@pytest.fixture(scope="module")
def server(data: Path) -> Iterator[RunningServer]:
    config = {"retention_sweep_interval_seconds": SWEEP, "http_listen": "127.0.0.1:0"}
    with running_server(data, **config) as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> Any:
    return server.stub()


def test_a_ttl_session_is_swept_and_audited(stub: Any, data: Path) -> None:
    """ttl 1 s: the session shows its expire_time, then the sweeper deletes it: GetSession says
    it does not exist and the erasure audit lists it, by "retention", reason "expired"."""
    created = stub.CreateSession(
        pb.CreateSessionRequest(session_id="ttl-1", events=[user("x")], ttl=ttl(1)), timeout=10
    )
    expires = created.session.expire_time.ToNanoseconds()
    assert 0 < expires - time.time_ns() <= 1_100_000_000
    assert get(stub, "ttl-1").expire_time.ToNanoseconds() == expires
    eventually(lambda: not get(stub, "ttl-1").exists)
    rows = [row for row in audit(data) if row["session_id"] == "ttl-1"]
    assert [(r["kind"], r["actor"], r["reason"]) for r in rows] == [
        ("DELETE", "retention", "expired")
    ]


def test_pinned_stays_until_unpinned_and_extension_keeps(stub: Any) -> None:
    """A pinned session outlives its ttl; unpinned, it goes. One whose expiry is pushed out
    before the sweep stays."""
    stub.CreateSession(
        pb.CreateSessionRequest(session_id="pin-1", ttl=ttl(0.5), pinned=True), timeout=10
    )
    stub.CreateSession(pb.CreateSessionRequest(session_id="ext-1", ttl=ttl(1.5)), timeout=10)
    extended = update(stub, pb.Session(session_id="ext-1", ttl=ttl(3600)), "ttl")
    assert extended.expire_time.ToNanoseconds() > time.time_ns() + 3000 * 10**9
    time.sleep(1.5 + 3 * SWEEP)
    held = get(stub, "pin-1")
    assert held.exists
    assert held.pinned
    assert get(stub, "ext-1").exists
    listed = stub.ListSessions(pb.ListSessionsRequest(filter="pinned = true"), timeout=10)
    assert "pin-1" in [s.session_id for s in listed.sessions]
    soon = f'expire_time < "{at(7200).ToJsonString()}"'
    listed = stub.ListSessions(pb.ListSessionsRequest(filter=soon), timeout=10)
    assert "ext-1" in [s.session_id for s in listed.sessions]
    assert "pin-1" in [s.session_id for s in listed.sessions]  # pinned: still shows its time
    update(stub, pb.Session(session_id="pin-1", pinned=False), "pinned")
    eventually(lambda: not get(stub, "pin-1").exists)
    assert get(stub, "ext-1").exists
    cleared = update(stub, pb.Session(session_id="ext-1"), "expire_time")
    assert not cleared.HasField("expire_time")


def test_appending_does_not_extend_expiry(stub: Any) -> None:
    """An append leaves expire_time where it was (the idle policy is for activity)."""
    created = stub.CreateSession(pb.CreateSessionRequest(session_id="app-1", ttl=ttl(60)))
    append(stub, "app-1", user("more"))
    assert get(stub, "app-1").expire_time == created.session.expire_time


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"ttl": ttl(0)}, "ttl"),
        ({"ttl": ttl(-5)}, "ttl"),
        ({"ttl": ttl(101 * 365 * 86400)}, "ttl"),
        ({"expire_time": at(-10)}, "expire_time"),
        ({"expire_time": Timestamp(seconds=0, nanos=0)}, "expire_time"),  # 1970: past, not none
        ({"expire_time": Timestamp(seconds=2_000_000_000, nanos=-1)}, "expire_time"),
        ({"expire_time": Timestamp(seconds=2_000_000_000, nanos=2_000_000_000)}, "expire_time"),
        ({"expire_time": Timestamp(seconds=253402300800)}, "expire_time"),  # past year 9999
        ({"ttl": Duration(seconds=5, nanos=-5)}, "ttl"),  # mixed signs: not a Duration
        ({"ttl": Duration(seconds=0, nanos=2_000_000_000)}, "ttl"),
    ],
)
def test_bad_expiry_at_create_is_refused(stub: Any, fields: dict[str, Any], field: str) -> None:
    """A zero, negative or over-long ttl and a past expire_time are INVALID_EXPIRATION; nothing
    is created."""
    request = pb.CreateSessionRequest(session_id="bad-create", events=[user("x")], **fields)
    check(failure(stub.CreateSession, request), INVALID, "INVALID_EXPIRATION", field=field)
    assert not get(stub, "bad-create").exists


def test_bad_expiry_at_update_is_refused(stub: Any) -> None:
    """At update too: a bad ttl, a past time, "ttl" without a ttl, or both paths; the session
    keeps its expiry."""
    stub.CreateSession(pb.CreateSessionRequest(session_id="bad-up", ttl=ttl(600)), timeout=10)
    before = get(stub, "bad-up").expire_time
    for session, paths in (
        (pb.Session(session_id="bad-up", ttl=ttl(0)), ["ttl"]),
        (pb.Session(session_id="bad-up", expire_time=at(-1)), ["expire_time"]),
        (pb.Session(session_id="bad-up"), ["ttl"]),
        (pb.Session(session_id="bad-up", ttl=ttl(5)), ["ttl", "expire_time"]),
        (pb.Session(session_id="bad-up", expire_time=Timestamp(seconds=0)), ["expire_time"]),
        (pb.Session(session_id="bad-up", expire_time=Timestamp(nanos=-1)), ["expire_time"]),
    ):
        request = pb.UpdateSessionRequest(session=session, update_mask=FieldMask(paths=paths))
        check(failure(stub.UpdateSession, request), INVALID, "INVALID_EXPIRATION")
    assert get(stub, "bad-up").expire_time == before


def test_cli_refuses_a_time_that_is_not_rfc3339(server: RunningServer, data: Path) -> None:
    """`create/update --expire-time` with no zone or no time: one usage line, exit 2, no
    traceback, nothing created."""
    for args in (
        ["create", "cli-bad-at", "--expire-time", "2030-01-01"],
        ["create", "cli-bad-at", "--expire-time", "2030-01-01T00:00:00"],
        ["update", "cli-bad-at", "--expire-time", "tomorrow"],
    ):
        done = run_cli_here([*args, "--server", server.address])
        assert done.returncode == 2, done
        assert "RFC 3339" in done.stderr
        assert "Traceback" not in done.stderr
    assert not get(server.stub(), "cli-bad-at").exists


def test_python_clients_and_cli_set_retention(server: RunningServer, data: Path) -> None:
    """Client.create_session(ttl=, pinned=), update_session(expire_time=, pinned=), the async
    client's ttl update, and `sessionlog create/update --ttl/--pin/--unpin`."""
    with Client(server.address) as client:
        made = client.create_session("py-1", ttl=120, pinned=True).session
        assert made.pinned
        assert made.HasField("expire_time")
        when = at(7200).ToDatetime(tzinfo=dt.UTC)
        later = client.update_session("py-1", expire_time=when, pinned=False)
        assert not later.pinned
        assert later.expire_time.ToNanoseconds() > time.time_ns() + 7000 * 10**9
        never = client.update_session("py-1", expire_time=None)
        assert not never.HasField("expire_time")

    async def run() -> bool:
        async with AsyncClient(server.address) as client:
            await client.create_session("py-2", expire_time=at(300).ToDatetime(tzinfo=dt.UTC))
            session = await client.update_session("py-2", ttl=1)
            return session.HasField("expire_time")

    assert asyncio.run(run())
    eventually(lambda: not get(server.stub(), "py-2").exists)

    def cli(*args: str) -> str:
        done = run_cli_here([*args, "--server", server.address, "--json"])
        assert done.returncode == 0, done.stderr
        return done.stdout

    made = json.loads(cli("create", "cli-1", "--ttl", "7d", "--pin"))["session"]
    assert made["pinned"] is True
    assert "expire_time" in made
    unpinned = json.loads(cli("update", "cli-1", "--unpin", "--expire-time", "never"))
    assert unpinned.get("pinned", False) is False
    assert "expire_time" not in unpinned
    again = run_cli_here(["update", "cli-1", "--pin", "--ttl", "1h", "--server", server.address])
    assert again.returncode == 0, again.stderr
    assert again.stdout.rstrip().endswith("pinned")
    assert "\texpires 20" in again.stdout
    bad = run_cli_here(["create", "cli-2", "--ttl", "soon", "--server", server.address])
    assert bad.returncode == 2
    assert "--ttl" in bad.stderr


# -- the idle policy -----------------------------------------------------------------------------


def test_the_idle_policy_deletes_idle_sessions_and_keeps_active_and_pinned(
    tmp_path: Path,
) -> None:
    """--retention-idle 2s: a session nobody touches goes, one appended to keeps living, a
    pinned one stays."""
    data = tmp_path / "data"
    config = {"retention_idle_seconds": 2.0, "retention_sweep_interval_seconds": SWEEP}
    with running_server(data, **config) as running:
        stub = running.stub()
        for session_id in ("idle-1", "busy-1", "held-1"):
            append(stub, session_id, user("x"))
        update(stub, pb.Session(session_id="held-1", pinned=True), "pinned")
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            append(stub, "busy-1", user("still here"))
            time.sleep(0.3)
        eventually(lambda: not get(stub, "idle-1").exists)
        assert get(stub, "busy-1").exists
        assert get(stub, "held-1").exists
    rows = [(r["session_id"], r["reason"]) for r in audit(data)]
    assert rows == [("idle-1", "retention policy")]


# -- tenants -------------------------------------------------------------------------------------


def test_a_tenant_sets_expiry_on_its_own_sessions_only(tmp_path: Path) -> None:
    """A tenant token creates and updates expiry inside its prefix and is refused outside."""
    tokens = tokens_file(tmp_path / "tokens.toml")
    with running_server(tmp_path / "data", auth_tokens=str(tokens)) as running:
        stub = running.stub()
        tenant, writer = bearer(TENANT_A), bearer(WRITER)
        stub.CreateSession(pb.CreateSessionRequest(session_id="tenant-b.x"), metadata=writer)
        mine = pb.CreateSessionRequest(session_id="tenant-a.x", ttl=ttl(600))
        assert stub.CreateSession(mine, metadata=tenant).session.HasField("expire_time")
        denied = grpc.StatusCode.PERMISSION_DENIED
        theirs = pb.CreateSessionRequest(session_id="tenant-b.y", ttl=ttl(600))
        check(failure(stub.CreateSession, theirs, metadata=tenant), denied, "PERMISSION_DENIED")
        request = pb.UpdateSessionRequest(
            session=pb.Session(session_id="tenant-b.x", ttl=ttl(1)),
            update_mask=FieldMask(paths=["ttl"]),
        )
        check(failure(stub.UpdateSession, request, metadata=tenant), denied, "PERMISSION_DENIED")
        got = stub.GetSession(pb.GetSessionRequest(session_id="tenant-b.x"), metadata=writer)
        assert not got.session.HasField("expire_time")
        update(stub, pb.Session(session_id="tenant-a.x", pinned=True), "pinned", metadata=tenant)


# -- replicas ------------------------------------------------------------------------------------


def test_a_replica_erases_an_expired_session_too(tmp_path: Path) -> None:
    """The primary's sweep is a DELETE on the feed: the replica loses the session and its
    events, keeps the others, and never sweeps itself."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary(args=["--retention-sweep-interval", "0.2"])
        replica = cluster.replica(primary, "replica", args=["--retention-sweep-interval", "0.2"])
        stub = primary.stub()
        stub.CreateSession(
            pb.CreateSessionRequest(session_id="rep-gone", events=[user("x")], ttl=ttl(1.5)),
            timeout=10,
        )
        stub.CreateSession(
            pb.CreateSessionRequest(session_id="rep-kept", events=[user("y")], ttl=ttl(3600)),
            timeout=10,
        )
        wait_position(replica, int(primary.status().position))
        assert since_raw(replica.channel, "rep-gone")
        eventually(lambda: not get(stub, "rep-gone").exists)
        wait_position(replica, int(primary.status().position))
        assert since_raw(replica.channel, "rep-gone") == []
        assert since_raw(replica.channel, "rep-kept") == since_raw(primary.channel, "rep-kept")
        kept = replica.stub().GetSession(pb.GetSessionRequest(session_id="rep-kept"), timeout=10)
        assert kept.session.expire_time.ToNanoseconds() > time.time_ns()


def test_export_and_import_keep_expiry_and_pin(server: RunningServer, data: Path) -> None:
    """`sessionlog export` then `import --session-id` makes a copy with the same expire_time
    and pin (a moved or restored session keeps its retention)."""
    stub = server.stub()
    made = stub.CreateSession(
        pb.CreateSessionRequest(session_id="exp-1", events=[user("x")], ttl=ttl(3600), pinned=True)
    ).session
    out = data.parent / "exp-1.jsonl"
    for args in (
        ["export", "exp-1", "-o", str(out)],
        ["import", str(out), "--session-id", "exp-2"],
    ):
        done = run_cli_here([*args, "--server", server.address])
        assert done.returncode == 0, done.stderr
    copy = get(stub, "exp-2")
    assert copy.expire_time == made.expire_time
    assert copy.pinned


def test_the_console_api_shows_expiry_and_pin(server: RunningServer) -> None:
    """/api/sessions rows carry expire_time_ms and pinned when set, and neither otherwise."""
    stub = server.stub()
    made = stub.CreateSession(
        pb.CreateSessionRequest(session_id="web-1", ttl=ttl(3600), pinned=True)
    ).session
    stub.CreateSession(pb.CreateSessionRequest(session_id="web-2"))
    query = urllib.parse.urlencode({"prefix": "web-"})
    url = f"http://127.0.0.1:{server.http_port}/api/sessions?{query}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        rows = {row["session_id"]: row for row in json.load(reply)["sessions"]}
    assert rows["web-1"]["expire_time_ms"] == made.expire_time.ToMilliseconds()
    assert rows["web-1"]["pinned"] is True
    assert "expire_time_ms" not in rows["web-2"]
    assert "pinned" not in rows["web-2"]


def test_a_retried_create_with_a_ttl_is_the_first_result(stub: Any) -> None:
    """The same request_id and ttl again returns the first call's session and expiry (the
    fingerprint holds the ttl, not the time it gave); a different ttl is REQUEST_ID_REUSED."""
    request = pb.CreateSessionRequest(session_id="retry-1", request_id="r-1", ttl=ttl(600))
    first = stub.CreateSession(request, timeout=10).session
    time.sleep(0.01)
    again = stub.CreateSession(request, timeout=10).session
    assert again.expire_time == first.expire_time
    other = pb.CreateSessionRequest(session_id="retry-1", request_id="r-1", ttl=ttl(601))
    check(failure(stub.CreateSession, other), INVALID, "REQUEST_ID_REUSED")
