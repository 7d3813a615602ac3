"""FollowSessions end to end: one stream of every session under a prefix or matching a filter,
in feed order, resumable by position with no gap and no duplicate; deletion markers;
heartbeats that advance an idle stream; tenant tokens kept inside their prefix; bad filters and
positions refused; a replica serves the same stream."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client import AsyncClient, Client
from tests.e2e._helpers import check, failure, say
from tests.e2e._proc import run_cli_here, running_server
from tests.e2e._replication_cluster import Cluster, wait_position
from tests.e2e.test_auth import ADMIN, TENANT_A, WRITER, bearer, tokens_file
from tests.e2e.test_client_python import FAST_RETRY, DropProxy
from tests.e2e.test_shards import Groups, groups  # noqa: F401  (the sharded servers)

pytestmark = pytest.mark.workers

Stub = pb_grpc.SessionLogServiceStub
Changes = list[pb.FollowedChange]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One server with auth on for the whole module: each test uses sessions of its own."""
    root = tmp_path_factory.mktemp("follow")
    tokens = tokens_file(root / "tokens.toml")
    with running_server(root / "data", auth_tokens=str(tokens)) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server: Any) -> Stub:
    stub: Stub = server.stub()
    return stub


def opened(stub: Stub, token: str = WRITER, **fields: Any) -> Any:
    """A FollowSessions call whose first response (caught up) has arrived: live from here."""
    call = stub.FollowSessions(
        pb.FollowSessionsRequest(**fields), metadata=bearer(token), timeout=30
    )
    first = next(call)
    assert first.caught_up
    assert not first.changes
    return call


def read_until(call: Any, done: Callable[[Changes], bool]) -> tuple[Changes, int]:
    """The changes a stream sends until ``done`` holds, and the last position it sent."""
    changes: Changes = []
    position = 0
    for response in call:
        assert response.position >= position
        position = response.position
        changes.extend(response.changes)
        if done(changes):
            call.cancel()
            return changes, position
    raise AssertionError("the stream ended early")


def events_of(changes: Sequence[Any]) -> list[tuple[str, int, str]]:
    """(session, seq, content) of each event of FollowedChange messages (server or client)."""
    return [(c.session_id, e.seq, str(e.data["content"])) for c in changes for e in c.events]


def write(stub: Stub, session_id: str, *contents: str) -> None:
    events = [say(text) for text in contents]
    stub.Append(pb.AppendRequest(session_id=session_id, events=events), metadata=bearer(WRITER))


def test_a_prefix_stream_sends_its_sessions_in_order_and_no_others(stub: Stub) -> None:
    """Events of two sessions under the prefix arrive in commit order, each change with its
    position; a session outside the prefix never shows."""
    call = opened(stub, prefix="p1.")
    write(stub, "p1.a", "a0", "a1")
    write(stub, "other.x", "x0")
    write(stub, "p1.b", "b0")
    write(stub, "p1.a", "a2")
    changes, _ = read_until(call, lambda c: len(events_of(c)) == 4)
    assert events_of(changes) == [
        ("p1.a", 0, "a0"),
        ("p1.a", 1, "a1"),
        ("p1.b", 0, "b0"),
        ("p1.a", 2, "a2"),
    ]
    positions = [c.position for c in changes]
    assert positions == sorted(positions)
    assert len(set(positions)) == 3


def test_a_label_filter_picks_matching_sessions_and_one_that_comes_to_match(stub: Stub) -> None:
    """Only sessions whose labels match are followed; a session whose labels change to match
    is followed from then on, its earlier events not replayed."""
    for session_id, team in (("lf.a", "core"), ("lf.b", "web")):
        stub.CreateSession(
            pb.CreateSessionRequest(session_id=session_id, labels={"team": team}),
            metadata=bearer(WRITER),
        )
    call = opened(stub, filter='labels.team = "core"')
    write(stub, "lf.a", "a0")
    write(stub, "lf.b", "b-before")
    stub.UpdateSession(
        pb.UpdateSessionRequest(
            session=pb.Session(session_id="lf.b", labels={"team": "core"}),
            update_mask={"paths": ["labels.team"]},
        ),
        metadata=bearer(WRITER),
    )
    write(stub, "lf.b", "b-after")
    changes, _ = read_until(call, lambda c: len(events_of(c)) == 2)
    assert events_of(changes) == [("lf.a", 0, "a0"), ("lf.b", 1, "b-after")]


def test_resuming_from_a_position_gives_exactly_the_rest(stub: Stub) -> None:
    """A stream resumed after a position it sent gets every later change once: no gap, no
    duplicate; from_start replays them all too."""
    call = opened(stub, prefix="rs.")
    for i in range(6):
        write(stub, f"rs.{i % 2}", f"e{i}")
    changes, _ = read_until(call, lambda c: len(c) == 6)
    cut = changes[2].position
    resumed = stub.FollowSessions(
        pb.FollowSessionsRequest(prefix="rs.", after_position=cut),
        metadata=bearer(WRITER),
        timeout=30,
    )
    rest, _ = read_until(resumed, lambda c: len(c) == 3)
    assert [c.SerializeToString() for c in rest] == [c.SerializeToString() for c in changes[3:]]
    replay = stub.FollowSessions(
        pb.FollowSessionsRequest(prefix="rs.", from_start=True),
        metadata=bearer(WRITER),
        timeout=30,
    )
    everything, _ = read_until(replay, lambda c: len(c) == 6)
    assert everything == changes


def test_a_deleted_session_shows_a_marker_and_its_events_never_replay(stub: Stub) -> None:
    """DeleteSession sends a deleted marker; a replay from the start afterwards holds the
    marker but none of the deleted session's events (its records are erased placeholders)."""
    call = opened(stub, prefix="del.")
    write(stub, "del.gone", "secret text")
    write(stub, "del.kept", "k0")
    stub.DeleteSession(pb.DeleteSessionRequest(session_id="del.gone"), metadata=bearer(WRITER))
    changes, _ = read_until(call, lambda c: any(x.deleted for x in c))
    assert [(c.session_id, c.deleted) for c in changes] == [
        ("del.gone", False),
        ("del.kept", False),
        ("del.gone", True),
    ]
    replay = stub.FollowSessions(
        pb.FollowSessionsRequest(prefix="del.", from_start=True),
        metadata=bearer(WRITER),
        timeout=30,
    )
    replayed, _ = read_until(replay, lambda c: any(x.deleted for x in c))
    assert [(c.session_id, c.deleted) for c in replayed] == [
        ("del.kept", False),
        ("del.gone", True),
    ]
    assert b"secret text" not in b"".join(c.SerializeToString() for c in replayed)


def test_heartbeats_advance_an_idle_filtered_stream(stub: Stub) -> None:
    """Writes the stream does not follow still move its position: a heartbeat carries it."""
    # Not the feed's first change, even when this test runs first on the module's server: the
    # resume below is after the heartbeat's position - 1, and after_position 0 means "from now".
    write(stub, "hb-first", "x")
    call = opened(stub, prefix="hb.none.", heartbeat_interval=Duration(nanos=200_000_000))
    write(stub, "hb.other", "x")
    for response in call:
        assert not response.changes
        if response.heartbeat and response.position:
            resumed = stub.FollowSessions(
                pb.FollowSessionsRequest(prefix="hb.", after_position=response.position - 1),
                metadata=bearer(WRITER),
                timeout=30,
            )
            changes, _ = read_until(resumed, lambda c: len(c) == 1)
            assert events_of(changes) == [("hb.other", 0, "x")]
            call.cancel()
            return
    raise AssertionError("no heartbeat")


@pytest.mark.serial  # counts heartbeats during 4 s of writes
def test_heartbeats_keep_coming_while_other_sessions_are_written(stub: Stub) -> None:
    """Commits a filtered stream has nothing to send for wake it but do not hold off its
    heartbeat: the client's watchdog must not take a quiet stream on a busy server for dead."""
    call = opened(stub, prefix="hb2.none.", heartbeat_interval=Duration(nanos=300_000_000))
    writing = threading.Event()
    writing.set()

    def writer() -> None:
        try:
            for n in range(40):  # one write every 0.1 s, for about 4 s
                write(stub, f"hb2.busy.{n % 4}", f"m{n}")
                time.sleep(0.1)
        finally:
            writing.clear()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    during = 0
    for response in call:  # a heartbeat at most 0.3 s apart ends this loop soon after the writes
        assert not response.changes
        if not writing.is_set():
            break
        during += 1
    call.cancel()
    thread.join(timeout=30)
    # About a dozen are due in 4 s; before the fix none came until the writes stopped.
    assert during >= 4, f"{during} heartbeats while other sessions were written"


def test_a_tenant_follows_only_its_own_prefix(stub: Stub) -> None:
    """A tenant token follows its own prefix; with no prefix it is narrowed to it (another
    tenant's writes never show); a foreign prefix is PERMISSION_DENIED."""
    own = opened(stub, TENANT_A, prefix="tenant-a.f")
    narrowed = opened(stub, TENANT_A)
    write(stub, "tenant-b.f1", "theirs")
    write(stub, "tenant-a.f1", "mine")
    for call in (own, narrowed):
        changes, _ = read_until(call, lambda c: len(c) == 1)
        assert events_of(changes) == [("tenant-a.f1", 0, "mine")]
    foreign = pb.FollowSessionsRequest(prefix="tenant-b.")
    refused = failure(
        lambda: next(stub.FollowSessions(foreign, metadata=bearer(TENANT_A), timeout=10))
    )
    check(refused, grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")


def refusal(stub: Stub, **fields: Any) -> grpc.RpcError:
    return failure(
        lambda: next(
            stub.FollowSessions(
                pb.FollowSessionsRequest(**fields), metadata=bearer(ADMIN), timeout=10
            )
        )
    )


def test_bad_filters_and_positions_are_refused(stub: Stub) -> None:
    """A filter that does not parse is INVALID_FILTER; a position past the feed's end is
    FEED_POSITION_AHEAD naming the head; after_position with from_start is MALFORMED_REQUEST."""
    check(refusal(stub, filter="labels.x ~ y"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FILTER")
    error = refusal(stub, after_position=10**9)
    check(error, grpc.StatusCode.FAILED_PRECONDITION, "FEED_POSITION_AHEAD")
    check(
        refusal(stub, after_position=1, from_start=True),
        grpc.StatusCode.INVALID_ARGUMENT,
        "MALFORMED_REQUEST",
    )


def test_a_replica_serves_the_same_stream(tmp_path: Path) -> None:
    """A replica's FollowSessions replays the primary's changes at the same positions."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        replica = cluster.replica(primary, "replica")
        stub = primary.stub()
        for i in range(4):
            stub.Append(pb.AppendRequest(session_id=f"rep.{i % 2}", events=[say(f"e{i}")]))
        wait_position(replica, primary.status().position)
        asked = pb.FollowSessionsRequest(prefix="rep.", from_start=True)
        mine, _ = read_until(stub.FollowSessions(asked, timeout=30), lambda c: len(c) == 4)
        theirs, _ = read_until(
            replica.stub().FollowSessions(asked, timeout=30), lambda c: len(c) == 4
        )
        assert theirs == mine
        live = replica.stub().FollowSessions(pb.FollowSessionsRequest(prefix="rep."), timeout=30)
        assert next(live).caught_up
        stub.Append(pb.AppendRequest(session_id="rep.0", events=[say("late")]))
        late, _ = read_until(live, lambda c: len(c) == 1)
        assert events_of(late) == [("rep.0", 2, "late")]


def test_the_python_client_resumes_after_a_cut_connection(server: Any, stub: Stub) -> None:
    """Client.follow_sessions replays from the start, survives a cut connection by resuming
    after its last position (no gap, no duplicate), and a tenant's stream stays in its prefix."""
    write(stub, "tenant-a.pc1", "a0", "a1")
    write(stub, "tenant-b.pc1", "theirs")
    proxy = DropProxy(server.port)
    try:
        with (
            Client(proxy.address, retry=FAST_RETRY, token=TENANT_A) as client,
            client.follow_sessions(prefix="tenant-a.pc", after=0) as changes,
        ):
            first = next(changes)
            assert [e.seq for e in first.events] == [0, 1]
            proxy.cut()
            write(stub, "tenant-b.pc1", "theirs again")
            write(stub, "tenant-a.pc1", "a2")
            write(stub, "tenant-a.pc2", "b0")
            rest = [next(changes), next(changes)]
            assert events_of(rest) == [("tenant-a.pc1", 2, "a2"), ("tenant-a.pc2", 0, "b0")]
            assert changes.reconnects >= 1
            assert changes.position == rest[-1].position
    finally:
        proxy.close()


def test_the_async_client_follows_with_a_filter_and_stops_when_caught_up(
    server: Any, stub: Stub
) -> None:
    """AsyncClient.follow_sessions with follow=False ends after the stored changes; the filter
    keeps the matching session only."""
    stub.CreateSession(
        pb.CreateSessionRequest(session_id="ac.yes", labels={"pick": "me"}),
        metadata=bearer(WRITER),
    )
    write(stub, "ac.yes", "y0")
    write(stub, "ac.no", "n0")

    async def run() -> list[tuple[str, int, str]]:
        async with AsyncClient(server.address, token=WRITER) as client:
            stream = client.follow_sessions(
                prefix="ac.", filter='labels.pick = "me"', after=0, follow=False
            )
            async with stream:
                got = [change async for change in stream]
            assert stream.caught_up
            return events_of(got)

    assert asyncio.run(run()) == [("ac.yes", 0, "y0")]


def test_the_cli_tails_a_prefix_with_a_filter_and_a_tenant_token(server: Any, stub: Stub) -> None:
    """`sessionlog tail --prefix P --filter F --no-follow --json` prints the matching
    sessions' events with their positions; --from-position resumes; a tenant token works."""
    for session_id, team in (("tenant-a.cli1", "core"), ("tenant-a.cli2", "web")):
        stub.CreateSession(
            pb.CreateSessionRequest(session_id=session_id, labels={"team": team}),
            metadata=bearer(WRITER),
        )
        write(stub, session_id, f"{team}-0", f"{team}-1")
    write(stub, "tenant-b.cli1", "theirs")
    base = ["tail", "--server", server.address, "--token", TENANT_A, "--no-follow", "--json"]

    def tail(*extra: str) -> list[dict[str, Any]]:
        done = run_cli_here([*base, *extra])
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    lines = tail("--prefix", "tenant-a.cli", "--filter", 'labels.team = "core"')
    assert [(x["session_id"], x["seq"]) for x in lines] == [
        ("tenant-a.cli1", 0),
        ("tenant-a.cli1", 1),
    ]
    narrowed = tail("--filter", 'labels.team = "web"')  # no prefix: the token's own
    assert {x["session_id"] for x in narrowed} == {"tenant-a.cli2"}
    rest = tail("--prefix", "tenant-a.cli", "--from-position", str(lines[0]["position"] + 1))
    assert [x["session_id"] for x in rest] == ["tenant-a.cli2", "tenant-a.cli2"]
    refused = run_cli_here([*base, "--prefix", "tenant-b."])
    assert refused.returncode == 1
    assert "PERMISSION_DENIED" in refused.stderr


def test_each_group_streams_its_own_sessions(groups: Groups) -> None:  # noqa: F811
    """Sharded: a group's stream holds the sessions it owns, at that group's positions; the
    other group's sessions are followed on the other group."""
    mine = [groups.session_of("g1", n) for n in (5, 6)]
    theirs = groups.session_of("g2", 5)
    for session_id in mine:
        groups.stub1.Append(pb.AppendRequest(session_id=session_id, events=[say(session_id)]))
    groups.stub2.Append(pb.AppendRequest(session_id=theirs, events=[say(theirs)]))
    asked = pb.FollowSessionsRequest(from_start=True)
    one, _ = read_until(
        groups.stub1.FollowSessions(asked, timeout=30),
        lambda c: {x.session_id for x in c} >= set(mine),
    )
    assert theirs not in {c.session_id for c in one}
    two, _ = read_until(
        groups.stub2.FollowSessions(asked, timeout=30),
        lambda c: theirs in {x.session_id for x in c},
    )
    assert not set(mine) & {c.session_id for c in two}


def test_a_python_stream_from_now_starts_when_it_is_made(server: Any, stub: Stub) -> None:
    """follow_sessions() with after=None opens its call at once: a change committed before the
    first read is delivered; one committed before the call is not (sync and async)."""
    write(stub, "now.a", "before")
    with (
        Client(server.address, token=WRITER) as client,
        client.follow_sessions(prefix="now.") as changes,
    ):
        time.sleep(0.3)  # the stream's start is fixed on the server by now
        write(stub, "now.a", "after")
        assert events_of([next(changes)]) == [("now.a", 1, "after")]

    async def run() -> list[tuple[str, int, str]]:
        async with AsyncClient(server.address, token=WRITER) as client:
            stream = client.follow_sessions(prefix="now.")
            async with stream:
                await asyncio.sleep(0.3)
                write(stub, "now.a", "async")
                return events_of([await stream.__anext__()])

    assert asyncio.run(run()) == [("now.a", 2, "async")]
