"""Read replicas as real processes: convergence, crash and restart, reconnection, refusals, lag.

Every server here is a `sessionlog serve` child process on 127.0.0.1 (free ports), stopped by
PID. "Identical" means byte-for-byte: reads fetch raw reply bytes (see ``_replication_cluster``).
"""

from __future__ import annotations

import itertools
import shutil
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2

from sessionlog import wire
from sessionlog.testing import error_info
from sessionlog.v1 import event_pb2, message_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._proc import free_port
from tests.e2e._replication_cluster import (
    CALL_TIMEOUT,
    Cluster,
    Node,
    changes_raw,
    derive_raw,
    event,
    follow_events,
    follow_raw,
    get_session_raw,
    list_sessions,
    percentile,
    positions,
    run_writers,
    session_ids,
    since_raw,
    state_raw,
    surface_raw,
    usage_raw,
    wait_for,
    wait_position,
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def seqs_of(raw_events: list[bytes]) -> list[int]:
    return [event_pb2.Event.FromString(raw).seq for raw in raw_events]


def assert_same_data(primary: Node, *replicas: Node) -> int:
    """Every read of every session gives the same answer on the primary and each replica:
    events, sessions, listings and the change feed byte-for-byte; surface and derived messages as
    equal messages (see test_folded_replies_are_byte_identical for their bytes). Returns the
    number of sessions compared."""
    ids = session_ids(primary.channel)
    pages = list_sessions(primary.channel)
    feed = changes_raw(primary.channel)
    assert positions(feed) == list(range(1, len(feed) + 1)), "primary feed not dense from 1"
    for replica in replicas:
        assert session_ids(replica.channel) == ids, f"{replica.name}: other sessions"
        assert list_sessions(replica.channel) == pages, f"{replica.name}: ListSessions differs"
        assert changes_raw(replica.channel) == feed, f"{replica.name}: change feed differs"
    for session_id in ids:
        events = since_raw(primary.channel, session_id)
        assert seqs_of(events) == list(range(len(events))), f"{session_id}: seqs not dense"
        derived = pb.DeriveMessagesResponse.FromString(derive_raw(primary.channel, session_id))
        surface = pb.SurfaceResponse.FromString(surface_raw(primary.channel, session_id))
        described = get_session_raw(primary.channel, session_id)
        for replica in replicas:
            where = f"{replica.name}, session {session_id}"
            assert since_raw(replica.channel, session_id) == events, f"{where}: events differ"
            assert get_session_raw(replica.channel, session_id) == described, f"{where}: session"
            replica_derived = derive_raw(replica.channel, session_id)
            assert pb.DeriveMessagesResponse.FromString(replica_derived) == derived, where
            replica_surface = surface_raw(replica.channel, session_id)
            assert pb.SurfaceResponse.FromString(replica_surface) == surface, where
    return len(ids)


def lifecycle_writes(primary: Node) -> None:
    """Creates, a seed, forks, leases (with a takeover and a forced release) and a replace."""
    stub = primary.stub()
    user = event_pb2.EVENT_TYPE_USER_MESSAGE
    turn = [event(event_pb2.EVENT_TYPE_TURN_START, "t"), event(user, "in a turn")]
    turn.append(event(event_pb2.EVENT_TYPE_TURN_END, "t"))
    stub.CreateSession(pb.CreateSessionRequest(session_id="created", events=turn), timeout=10)
    stub.CreateSession(pb.CreateSessionRequest(session_id="created-empty"), timeout=10)
    seeded = [
        message_pb2.Message(role=message_pb2.ROLE_SYSTEM, content="be brief"),
        message_pb2.Message(role=message_pb2.ROLE_USER, content="hello"),
    ]
    seeded[1].created_at.FromSeconds(1_700_000_000)
    stub.SeedSession(pb.SeedSessionRequest(session_id="seeded", messages=seeded), timeout=10)
    stub.ForkSession(
        pb.ForkSessionRequest(parent_session_id="created", at_seq=2, session_id="forked"),
        timeout=10,
    )
    stub.ForkSession(pb.ForkSessionRequest(parent_session_id="seeded"), timeout=10)
    minute = Duration(seconds=60)
    stub.AcquireLease(pb.AcquireLeaseRequest(session_id="leased", holder="a", ttl=minute))
    stub.Append(
        pb.AppendRequest(session_id="leased", events=[event(user, "x")], lease_holder="a"),
        timeout=10,
    )
    stub.RenewLease(pb.RenewLeaseRequest(session_id="leased", holder="a", ttl=minute))
    stub.AcquireLease(
        pb.AcquireLeaseRequest(session_id="taken", holder="old", ttl=Duration(nanos=1_000_000))
    )
    time.sleep(0.01)
    stub.AcquireLease(pb.AcquireLeaseRequest(session_id="taken", holder="new", ttl=minute))
    stub.AcquireLease(pb.AcquireLeaseRequest(session_id="forced", holder="w", ttl=minute))
    stub.ReleaseLease(pb.ReleaseLeaseRequest(session_id="forced", holder="operator", force=True))
    summary = event(event_pb2.EVENT_TYPE_SYSTEM_MESSAGE, "summary of 0..1")
    summary.surface_op.replace.start_seq, summary.surface_op.replace.stop_seq = 0, 1
    stub.Append(pb.AppendRequest(session_id="seeded", events=[summary]), timeout=10)


def test_two_replicas_converge_byte_identical(tmp_path: Path) -> None:
    """Two replicas of a primary that 4 writers fill with 5,000 events over 50 sessions (plus
    creates, seeds, forks and leases) end with byte-identical reads of every session."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        first = cluster.replica(primary, "replica-1")
        sessions = [f"s{i:02d}" for i in range(50)]
        log = run_writers(
            primary.address, sessions, writers=4, events_per_writer=1250, batch=25, deadline=45
        )
        lifecycle_writes(primary)
        second = cluster.replica(primary, "replica-2")  # joins late: catches up, then follows
        more = run_writers(primary.address, sessions[:5], writers=1, events_per_writer=100, batch=5)
        assert (log.total, more.total) == (5000, 100)
        head = primary.status().position
        for replica in (first, second):
            wait_position(replica, head, timeout=30)
        for session_id, acked in log.acked.items():
            assert len(since_raw(primary.channel, session_id)) == len(acked) + len(
                more.acked.get(session_id, [])
            )
        compared = assert_same_data(primary, first, second)
        assert compared == 50 + 6  # created, created-empty, seeded, forked, its fork, leased
        for lease_only in ("taken", "forced"):  # leases on sessions never written
            described = get_session_raw(primary.channel, lease_only)
            assert get_session_raw(first.channel, lease_only) == described
            assert get_session_raw(second.channel, lease_only) == described
        taken = pb.GetSessionResponse.FromString(get_session_raw(second.channel, "taken"))
        assert taken.session.lease.holder == "new"
        assert [a.previous_holder for a in taken.lease_audit] == ["old"]
        forced = pb.GetSessionResponse.FromString(get_session_raw(first.channel, "forced"))
        assert not forced.session.HasField("lease")
        assert len(forced.lease_audit) == 1


def test_folded_replies_are_byte_identical(tmp_path: Path) -> None:
    """Surface and DeriveMessages give the same bytes on the primary and on a replica for the
    same stored events, even when data holds objects with several keys."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        replica = cluster.replica(primary, "replica")
        metadata = {"model": "m", "tokens": 12, "cost": 0.5, "tags": ["x"], "extra": {"a": 1}}
        calls = [{"id": "c1", "name": "search", "arguments": {"q": "x", "limit": 3, "page": 1}}]
        events = [
            event(event_pb2.EVENT_TYPE_USER_MESSAGE, "question", metadata=metadata),
            event(event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE, "", tool_calls=calls, metadata=metadata),
            event(event_pb2.EVENT_TYPE_TOOL_RESULT, "found", tool_call_id="c1", name="search"),
        ]
        events[0].state_delta.update({"z": 1, "a": {"k": [1, 2], "b": None}, "m": "x"})
        events[2].state_delta.update({"q": True, "z": None})
        events[1].usage.CopyFrom(event_pb2.Usage(model="gpt", input_tokens=9, output_tokens=4))
        events[2].usage.CopyFrom(event_pb2.Usage(model="alt", input_tokens=2))
        primary.stub().Append(pb.AppendRequest(session_id="rich", events=events), timeout=10)
        wait_position(replica, primary.status().position)
        assert since_raw(replica.channel, "rich") == since_raw(primary.channel, "rich")
        assert surface_raw(replica.channel, "rich") == surface_raw(primary.channel, "rich")
        assert derive_raw(replica.channel, "rich") == derive_raw(primary.channel, "rich")
        folded_state = state_raw(primary.channel, "rich")
        assert state_raw(replica.channel, "rich") == folded_state
        assert set(pb.GetStateResponse.FromString(folded_state).state.fields) == {"a", "m", "q"}
        totals = usage_raw(primary.channel, "rich")
        assert usage_raw(replica.channel, "rich") == totals
        assert [u.model for u in pb.GetUsageResponse.FromString(totals).usage] == ["alt", "gpt"]
        fork = pb.ForkSessionRequest(parent_session_id="rich", session_id="rich.f", at_seq=1)
        primary.stub().ForkSession(fork, timeout=10)
        wait_position(replica, primary.status().position)
        copied = usage_raw(primary.channel, "rich.f")
        assert usage_raw(replica.channel, "rich.f") == copied
        assert [u.model for u in pb.GetUsageResponse.FromString(copied).usage] == ["gpt"]


def test_hide_and_state_read_the_same_on_a_replica(tmp_path: Path) -> None:
    """A hide and state deltas written on the primary give a replica the same surface, derived
    messages and state, whole and at every seq, as the primary (bytes equal)."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        replica = cluster.replica(primary, "replica")
        user, assistant = event_pb2.EVENT_TYPE_USER_MESSAGE, event_pb2.EVENT_TYPE_ASSISTANT_MESSAGE
        events = [event(user, "one"), event(assistant, "two"), event(user, "three")]
        events[0].state_delta.update({"step": 1, "cart": {"apples": 1}})
        events[2].state_delta.update({"step": 2, "user": "ann"})
        hide = event_pb2.Event(type=event_pb2.EVENT_TYPE_HIDE)
        hide.surface_op.replace.start_seq, hide.surface_op.replace.stop_seq = 1, 2
        hide.state_delta.update({"cart": None, "hidden": True})
        after = event(assistant, "four")
        stub = primary.stub()
        stub.Append(pb.AppendRequest(session_id="hidden", events=events), timeout=10)
        stub.Append(pb.AppendRequest(session_id="hidden", events=[hide, after]), timeout=10)
        wait_position(replica, primary.status().position)
        derived = pb.DeriveMessagesResponse.FromString(derive_raw(primary.channel, "hidden"))
        assert [m.content for m in derived.messages] == ["one", "four"]
        assert list(derived.seqs) == [0, 4]
        whole = pb.GetStateResponse.FromString(state_raw(primary.channel, "hidden"))
        assert wire_state(whole) == ({"step": 2, "user": "ann", "hidden": True}, 5)
        for at_seq in (None, 0, 1, 2, 3, 4):
            where = f"at_seq {at_seq}"
            for read in (surface_raw, derive_raw, state_raw):
                on_primary = read(primary.channel, "hidden", at_seq)
                assert read(replica.channel, "hidden", at_seq) == on_primary, where
        before_hide = pb.SurfaceResponse.FromString(surface_raw(replica.channel, "hidden", 2))
        assert [e.seq for e in before_hide.events] == [0, 1, 2]
        at_hide = pb.GetStateResponse.FromString(state_raw(replica.channel, "hidden", 3))
        assert wire_state(at_hide) == ({"step": 2, "user": "ann", "hidden": True}, 4)
        early = pb.GetStateResponse.FromString(state_raw(replica.channel, "hidden", 0))
        assert wire_state(early) == ({"step": 1, "cart": {"apples": 1}}, 1)


def wire_state(reply: pb.GetStateResponse) -> tuple[dict[str, Any], int]:
    return MessageToDict(reply.state), reply.event_count


def start_catching_up_and_kill(cluster: Cluster, primary: Node, head: int, tries: int = 3) -> int:
    """Start a replica of a primary holding ``head`` changes and SIGKILL it while it is catching
    up (at least a quarter of the way, not yet at the head). Returns the position seen just
    before the kill."""
    replica = Node(cluster.root, "replica", replica_of=primary.address)
    cluster.nodes.append(replica)
    for _ in range(tries):
        replica.start(wait=False)
        seen = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and replica.running and seen < head // 4:
            try:
                seen = replica.status().position
            except grpc.RpcError:  # not answering yet
                time.sleep(0.005)
        if seen < head:
            replica.kill()
            return seen
        replica.stop()  # it finished before we could catch it mid-way: start over, fresh
        shutil.rmtree(replica.data)
    raise AssertionError(f"never caught the replica mid catch-up in {tries} tries")


def _answers(node: Node) -> bool:
    try:
        node.status()
    except grpc.RpcError:
        return False
    return True


def test_replica_killed_mid_catch_up_resumes_without_gap_or_duplicate(tmp_path: Path) -> None:
    """A replica SIGKILLed half-way through catching up on 20,000 events restarts from its own
    durable position and converges: no gap, no duplicate, every session byte-identical."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        sessions = [f"big{i:02d}" for i in range(20)]
        pad = "." * 3000  # ~60 MB in all: catching up takes many responses and commits
        run_writers(
            primary.address,
            sessions,
            writers=2,
            events_per_writer=10_000,
            batch=100,
            pad=pad,
            rich=False,
        )
        head = primary.status().position
        assert head == 200
        killed_at = start_catching_up_and_kill(cluster, primary, head)
        replica = cluster.nodes[-1]
        assert head // 4 <= killed_at < head
        started = time.monotonic()
        replica.start(wait=False)
        resumed = wait_for("restarted replica answers", lambda: _answers(replica), 20)
        assert replica.status().position >= killed_at, "the replica lost changes it had applied"
        assert replica.process is not None
        replica.process.wait_serving(replica.address)  # SERVING once caught up again
        catch_up = time.monotonic() - started
        wait_position(replica, head)
        run_writers(primary.address, sessions[:3], writers=1, events_per_writer=60, batch=6)
        wait_position(replica, primary.status().position)
        feed = changes_raw(replica.channel)
        assert positions(feed) == list(range(1, head + 11))  # dense: no gap, no duplicate
        assert assert_same_data(primary, replica) == 20
        rate = (20_000 * (head - killed_at) / head) / catch_up
        print(
            f"\n[replication] killed at position {killed_at}/{head}; restarted replica answered "
            f"after {resumed:.2f}s and caught up "
            f"in {catch_up:.2f}s (~{rate:,.0f} events/s of ~3 KB, process start included)"
        )


def test_replica_reconnects_after_primary_restart(tmp_path: Path) -> None:
    """A replica whose primary stops (SIGTERM) keeps serving reads, notices the loss, and once
    the primary is back on the same data and port reconnects by itself and catches up."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        replica = cluster.replica(primary, "replica")
        run_writers(primary.address, ["a", "b"], writers=2, events_per_writer=200, batch=10)
        wait_position(replica, primary.status().position)
        before = since_raw(replica.channel, "a")
        assert primary.stop() == 0
        wait_for("replica sees its primary gone", lambda: not replica.status().connected, 10)
        status = replica.status()
        assert status.caught_up
        assert status.primary == primary.address
        assert replica.health() == SERVING  # it has caught up once: it keeps serving reads
        assert since_raw(replica.channel, "a") == before
        time.sleep(1.0)  # nothing is written while the primary is down
        primary.start()
        back = wait_for("replica reconnects by itself", lambda: replica.status().connected, 15)
        run_writers(primary.address, ["a", "c"], writers=2, events_per_writer=300, batch=10)
        head = primary.status().position
        wait_position(replica, head, timeout=20)
        assert replica.status().connected
        assert assert_same_data(primary, replica) == 3
        print(f"\n[replication] replica reconnected {back:.2f}s after its primary came back")


def reconnect_attempts(node: Node) -> list[float]:
    """When the replica logged a failed attempt to follow its primary (epoch seconds)."""
    return [
        datetime.strptime(entry["time"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
        for entry in node.log_entries()
        if "reconnecting" in entry.get("message", "")
    ]


def test_replica_backoff_starts_over_after_a_healthy_connection(tmp_path: Path) -> None:
    """A replica that followed its primary happily retries quickly when it loses it again: the
    backoff grown while the primary was first missing does not carry over to the next outage."""
    with Cluster(tmp_path) as cluster:
        port = free_port()
        replica = cluster.replica(f"127.0.0.1:{port}", "replica", wait=False)
        wait_for("4 failed attempts", lambda: len(reconnect_attempts(replica)) >= 4, 10)
        primary = cluster.primary(port=port)  # the replica's backoff is now 0.8 s or more
        wait_for("replica connected", lambda: replica.status().connected, 10)
        primary.stub().Append(
            pb.AppendRequest(
                session_id="s", events=[event(event_pb2.EVENT_TYPE_USER_MESSAGE, "x")]
            ),
            timeout=10,
        )
        wait_position(replica, 1)
        time.sleep(0.5)  # a healthy, caught-up connection
        before = len(reconnect_attempts(replica))
        assert primary.stop() == 0
        time.sleep(1.2)
        attempts = reconnect_attempts(replica)[before:]
        primary.start()
        took = wait_for("replica reconnected", lambda: replica.status().connected, 10)
        gaps = [round(b - a, 2) for a, b in itertools.pairwise(attempts)]
        print(f"\n[replication] retries after the second loss: gaps {gaps}s; back {took:.2f}s")
        assert len(attempts) >= 3, (
            f"only {len(attempts)} attempt(s) in the 1.2 s after losing the primary (gaps {gaps}): "
            "the backoff was not reset after the healthy connection"
        )


def test_followers_on_primary_and_replica_see_the_same_stream(tmp_path: Path) -> None:
    """A Since follower on the primary and one on a replica, started before 4 writers run, both
    receive the whole session in seq order, byte-identical to the stored log."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        replica = cluster.replica(primary, "replica")
        expected = 4 * 50 * 10  # 4 writers, 100 batches of 10 each, every other one to "tail"
        received: dict[str, list[bytes]] = {}
        failures: list[BaseException] = []
        streams = {
            name: follow_raw(node.channel, "tail")
            for name, node in (("p", primary), ("r", replica))
        }

        def drain(name: str) -> None:
            try:
                received[name] = follow_events(streams[name], expected)
            except BaseException as error:
                failures.append(error)
            finally:
                streams[name].cancel()

        readers = [threading.Thread(target=drain, args=(n,), daemon=True) for n in streams]
        for reader in readers:
            reader.start()
        log = run_writers(
            primary.address, ["tail", "other"], writers=4, events_per_writer=1000, batch=10
        )
        for reader in readers:
            reader.join(30)
        assert not failures, failures
        assert len(log.acked["tail"]) == expected
        stored = since_raw(primary.channel, "tail")
        assert seqs_of(stored) == list(range(expected))
        assert received["p"] == stored
        assert received["r"] == stored


WRITES: dict[str, Callable[[Any], Any]] = {
    "Append": lambda s: s.Append(
        pb.AppendRequest(session_id="s", events=[event(event_pb2.EVENT_TYPE_USER_MESSAGE, "no")]),
        timeout=CALL_TIMEOUT,
    ),
    "CreateSession": lambda s: s.CreateSession(
        pb.CreateSessionRequest(session_id="new"), timeout=CALL_TIMEOUT
    ),
    "SeedSession": lambda s: s.SeedSession(
        pb.SeedSessionRequest(
            session_id="new", messages=[message_pb2.Message(role=message_pb2.ROLE_USER)]
        ),
        timeout=CALL_TIMEOUT,
    ),
    "ForkSession": lambda s: s.ForkSession(
        pb.ForkSessionRequest(parent_session_id="s", session_id="new"), timeout=CALL_TIMEOUT
    ),
    "AcquireLease": lambda s: s.AcquireLease(
        pb.AcquireLeaseRequest(session_id="s", holder="b"), timeout=CALL_TIMEOUT
    ),
    "RenewLease": lambda s: s.RenewLease(
        pb.RenewLeaseRequest(session_id="leased", holder="a"), timeout=CALL_TIMEOUT
    ),
    "ReleaseLease": lambda s: s.ReleaseLease(
        pb.ReleaseLeaseRequest(session_id="leased", holder="a"), timeout=CALL_TIMEOUT
    ),
}


def snapshot(node: Node) -> tuple[Any, ...]:
    return (
        changes_raw(node.channel),
        list_sessions(node.channel),
        since_raw(node.channel, "s"),
        get_session_raw(node.channel, "leased"),
        get_session_raw(node.channel, "new"),
    )


def test_replica_refuses_every_write_with_not_primary(tmp_path: Path) -> None:
    """Every write RPC sent to a replica fails with FAILED_PRECONDITION / NOT_PRIMARY naming the
    primary, and changes nothing there nor on the primary."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        replica = cluster.replica(primary, "replica")
        stub = primary.stub()
        user = event(event_pb2.EVENT_TYPE_USER_MESSAGE, "hi")
        stub.Append(pb.AppendRequest(session_id="s", events=[user, user]), timeout=10)
        stub.AcquireLease(pb.AcquireLeaseRequest(session_id="leased", holder="a"), timeout=10)
        wait_position(replica, primary.status().position)
        on_replica, on_primary = snapshot(replica), snapshot(primary)
        refused = []
        for name, call in WRITES.items():
            with pytest.raises(grpc.RpcError) as caught:
                call(replica.stub())
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, name
            info = error_info(caught.value)
            assert (info.reason, info.domain) == ("NOT_PRIMARY", "sessionlog"), name
            assert info.metadata["primary"] == primary.address, name
            assert primary.address in caught.value.details(), name
            refused.append(name)
        assert len(refused) == 7
        time.sleep(0.2)
        assert snapshot(replica) == on_replica
        assert snapshot(primary) == on_primary


def test_replica_not_serving_until_first_caught_up(tmp_path: Path) -> None:
    """A replica whose primary is not there yet reports NOT_SERVING, connected = false and
    caught_up = false; once the primary comes up it catches up and turns SERVING."""
    with Cluster(tmp_path) as cluster:
        port = free_port()
        target = f"127.0.0.1:{port}"
        replica = cluster.replica(target, "replica", wait=False)
        wait_for("replica answers", lambda: replica.health() is not None, 20)
        for _ in range(5):
            assert replica.health() == NOT_SERVING
            status = replica.status()
            assert (status.role, status.primary) == ("replica", target)
            assert (status.connected, status.caught_up) == (False, False)
            assert status.position == 0
            time.sleep(0.1)
        primary = cluster.primary(port=port)
        primary.stub().Append(
            pb.AppendRequest(
                session_id="s", events=[event(event_pb2.EVENT_TYPE_USER_MESSAGE, "x")]
            ),
            timeout=10,
        )
        took = wait_for("replica SERVING", lambda: replica.health() == SERVING, 15)
        wait_position(replica, 1)
        status = replica.status()
        assert (status.caught_up, status.connected, status.lag_positions) == (True, True, 0)
        print(f"\n[replication] replica SERVING {took:.2f}s after its primary came up")


def test_replication_lag(tmp_path: Path) -> None:
    """While one writer appends at a steady rate on the primary, a follower on the replica sees
    each event soon after the primary acknowledged it (p99 bound generous, numbers printed)."""
    rate, seconds = 500, 5.0
    count = int(rate * seconds)
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        replica = cluster.replica(primary, "replica")
        acked: dict[int, float] = {}
        arrived: dict[int, float] = {}
        stream = follow_raw(replica.channel, "lag", timeout=60)

        def tail() -> None:
            for _ in range(count * 2):
                if len(arrived) >= count:
                    break
                _, payloads = wire.split_field(next(stream), 1)
                now = time.monotonic()
                for raw in payloads:
                    arrived[event_pb2.Event.FromString(raw).seq] = now

        reader = threading.Thread(target=tail, daemon=True)
        reader.start()
        stub = primary.stub()
        pending: list[Any] = []

        def on_ack(future: Any) -> None:
            now = time.monotonic()
            acked[future.result().events[0].seq] = now

        started = time.monotonic()
        for i in range(count):  # one writer, paced; calls overlap so the pace holds
            wait = started + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            request = pb.AppendRequest(
                session_id="lag", events=[event(event_pb2.EVENT_TYPE_USER_MESSAGE, f"m{i}")]
            )
            future = stub.Append.future(request, timeout=CALL_TIMEOUT)
            future.add_done_callback(on_ack)
            pending.append(future)
        for future in pending:
            future.result()
        written = time.monotonic() - started
        reader.join(20)
        stream.cancel()
        assert len(arrived) == count, f"the replica follower got {len(arrived)} of {count}"
        wait_for("every ack recorded", lambda: len(acked) == count, 5)
        lags = [arrived[seq] - acked[seq] for seq in range(count)]
        span = max(arrived.values()) - started
        p50, p99 = percentile(lags, 0.5), percentile(lags, 0.99)
        print(
            f"\n[replication] lag primary-ack -> replica-follower over {count} single-event "
            f"appends: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max "
            f"{max(lags) * 1000:.1f} ms; offered {count / written:,.0f} events/s, delivered on "
            f"the replica {count / span:,.0f} events/s"
        )
        assert p99 < 2.0
