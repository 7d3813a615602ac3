"""The Python clients across a group: several addresses, NOT_PRIMARY hints, etcd, failover.

A group here is a primary and a replica, real `sessionlog serve` processes. A failover is done
with today's pieces: SIGKILL the primary, restart the replica's folder without `--replica-of`
(today's promotion), restart the old primary's folder as a replica of the new one. Replication
is asynchronous, so before the kill the test holds the writer between two appends and waits
until the replica has everything the primary committed: what `--ack replica` will guarantee.
Everything the writer does after that (appends sent to a dead primary, to a replica, to the
promoted one) is the clients' doing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from bench.etcd import EtcdProcess, etcd_server
from sessionlog_client import AsyncClient, Client, Retry, errors, event
from sessionlog_client.v1.event_pb2 import Event
from tests.e2e._proc import free_port, run_cli
from tests.e2e._replication_cluster import Cluster, Node, wait_for, wait_position

RETRY = Retry(give_up_after=60.0, initial_backoff=0.02, max_backoff=0.25)
WRITES = 60
KILL_AT = 20


def note(text: str) -> Event:
    return event("user_message", {"content": text})


def contents(client: Client, session_id: str) -> list[tuple[int, str]]:
    return [(e.seq, str(e.data["content"])) for e in client.since(session_id)]


def promote(old: Node, new: Node) -> None:
    """Today's failover: kill ``old`` (SIGKILL) unless that is done, restart ``new``'s folder
    as the primary, then ``old``'s folder as a replica of it (it has nothing the new primary
    lacks)."""
    if old.running:
        old.kill()
    new.stop()
    new.replica_of = ""
    new.start()
    old.replica_of = new.address
    old.start()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[tuple[Cluster, Node, Node]]:
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary("a")
        replica = cluster.replica(primary, "b")
        yield cluster, primary, replica


# -- routing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("replica_first", [True, False])
def test_writes_go_to_the_primary_whatever_the_order(
    group: tuple[Cluster, Node, Node], replica_first: bool
) -> None:
    """Given both addresses in either order, every write lands on the primary (the replica's
    NOT_PRIMARY hint is followed, also for calls never retried), and reads work."""
    _, primary, replica = group
    order = (
        [replica.address, primary.address] if replica_first else [primary.address, replica.address]
    )
    with Client(order, retry=RETRY) as client:
        client.append("s", [note("one")])
        assert client.current == primary.address
        client.create_session("t", [note("two")])
        client.acquire_lease("s", "worker", ttl=30)
        assert client.get_session("t").session.event_count == 1
        assert client.members == order
    with Client(primary.address) as direct:
        assert contents(direct, "s") == [(0, "one")]
        assert contents(direct, "t") == [(0, "two")]


def test_one_address_keeps_todays_behaviour(group: tuple[Cluster, Node, Node]) -> None:
    """A single address given as a string routes nowhere: a replica's NOT_PRIMARY is raised
    with its hint, and the client stays on that address."""
    _, primary, replica = group
    with Client(replica.address, retry=RETRY) as client:
        with pytest.raises(errors.NotPrimary) as refused:
            client.append("s", [note("one")])
        assert refused.value.metadata["primary"] == primary.address
        assert client.members == [replica.address]


@pytest.mark.serial  # fails within 10 s, not the retry budget
def test_unreachable_addresses_fail_at_once_naming_every_one() -> None:
    """When no address of the list ever answers, the first call fails at once (not after the
    retry budget) and names them all."""
    addresses = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    started = time.monotonic()
    with (
        Client(addresses, retry=RETRY, connect_timeout=1.0) as client,
        pytest.raises(errors.Unavailable) as failed,
    ):
        client.get_session("s")
    assert time.monotonic() - started < 10
    assert all(a in failed.value.message for a in addresses), failed.value.message


# -- failover --------------------------------------------------------------------------------------


class Writer(threading.Thread):
    """Appends note n0..n{WRITES-1} one at a time with request ids r0.., holding ``gate`` for
    each append so the test can stop it between two appends; records each acknowledged seq."""

    def __init__(self, client: Client, session_id: str) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.session_id = session_id
        self.gate = threading.Lock()
        self.acked: dict[str, int] = {}
        self.slowest = 0.0
        """The seconds of the longest append: the one that waited out the failover."""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for n in range(WRITES):
                with self.gate:
                    started = time.monotonic()
                    reply = self.client.append(self.session_id, [note(f"n{n}")], request_id=f"r{n}")
                    self.slowest = max(self.slowest, time.monotonic() - started)
                self.acked[f"r{n}"] = reply.events[0].seq
                time.sleep(0.01)
        except BaseException as error:  # reported by the test
            self.error = error


class Follower(threading.Thread):
    """Follows a session until it has seen ``WRITES`` events (bounded in time)."""

    def __init__(self, client: Client, session_id: str) -> None:
        super().__init__(daemon=True)
        self.stream = client.follow(session_id, heartbeat=0.5)
        self.seen: list[tuple[int, str]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for ev in self.stream:
                self.seen.append((ev.seq, str(ev.data["content"])))
                if len(self.seen) == WRITES:
                    return
        except BaseException as error:
            self.error = error


@pytest.mark.parametrize("replica_first", [False, True])
def test_writer_and_follower_survive_a_failover(
    group: tuple[Cluster, Node, Node], replica_first: bool
) -> None:
    """Across SIGKILL of the primary and a promotion, a writer with request ids loses nothing
    acknowledged and writes nothing twice, and a follow() sees every event once, in order."""
    _, primary, replica = group
    order = (
        [replica.address, primary.address] if replica_first else [primary.address, replica.address]
    )
    with Client(order, retry=RETRY) as writes, Client(order, retry=RETRY) as reads:
        writer = Writer(writes, "s")
        follower = Follower(reads, "s")
        follower.start()
        writer.start()
        wait_for("the writer is under way", lambda: len(writer.acked) >= KILL_AT, 30)
        with writer.gate:  # between two appends: let the replica catch up, then kill
            wait_position(replica, primary.status().position)
            primary.kill()
        promote(primary, replica)  # the writer goes on meanwhile, against a dead primary
        writer.join(90)
        follower.join(30)
        follower.stream.close()
        assert writer.error is None, writer.error
        assert follower.error is None, follower.error
        assert len(writer.acked) == WRITES
        expected = [(n, f"n{n}") for n in range(WRITES)]
        assert sorted(writer.acked.values()) == list(range(WRITES))
        assert all(writer.acked[f"r{n}"] == n for n in range(WRITES))
        assert contents(writes, "s") == expected
        assert follower.seen == expected
        assert follower.stream.reconnects >= 1
        assert writer.slowest > 0.3, "no append waited for the promotion"
        assert writes.current == replica.address  # the promoted folder
        # A retry of an append acknowledged before the failover finds it on the new primary.
        again = writes.append("s", [note("n3")], request_id="r3")
        assert again.events[0].seq == 3
        assert contents(writes, "s") == expected
    wait_position(primary, replica.status().position)
    with Client(primary.address) as old:
        assert contents(old, "s") == expected


def test_append_moves_on_from_a_frozen_primary(group: tuple[Cluster, Node, Node]) -> None:
    """A SIGSTOPped primary holds an append until its deadline; in a group the append then
    tries the other members (with its request id) until the promoted replica takes it."""
    _, primary, replica = group
    with Client([primary.address, replica.address], retry=RETRY, timeout=1.0) as client:
        client.append("s", [note("n0")], request_id="r0")
        wait_position(replica, primary.status().position)
        frozen = primary.pids  # the server and its workers, if it runs several
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            outcome: list[object] = []

            def append() -> None:
                try:
                    outcome.append(client.append("s", [note("n1")], request_id="r1"))
                except BaseException as error:  # reported below
                    outcome.append(error)

            caller = threading.Thread(target=append, daemon=True)
            caller.start()
            time.sleep(1.5)  # its first try has run into its deadline at the frozen primary
            assert caller.is_alive()
            assert not outcome
            replica.stop()
            replica.replica_of = ""
            replica.start()
            caller.join(30)
        finally:
            for pid in frozen[1:]:
                os.kill(pid, signal.SIGKILL)  # ends a stopped process too
            primary.kill()
        [reply] = outcome
        assert not isinstance(reply, BaseException), reply
        assert client.current == replica.address
        assert contents(client, "s") == [(0, "n0"), (1, "n1")]


def test_async_client_follows_hints_and_survives_a_failover(
    group: tuple[Cluster, Node, Node],
) -> None:
    """AsyncClient: the replica's hint sends writes to the primary; across a failover, appends
    with request ids and a follow go on against the promoted folder without gap or duplicate."""
    _, primary, replica = group

    async def scenario() -> tuple[list[int], list[int]]:
        async with AsyncClient([replica.address, primary.address], retry=RETRY) as client:
            for n in range(5):
                await client.append("s", [note(f"n{n}")], request_id=f"r{n}")
            assert client.current == primary.address
            seen: list[int] = []
            async with client.follow("s", heartbeat=0.5) as stream:
                async for ev in stream:
                    seen.append(ev.seq)
                    if ev.seq == 4:
                        wait_position(replica, primary.status().position)
                        primary.kill()
                        promotion = asyncio.create_task(
                            asyncio.to_thread(promote, primary, replica)
                        )
                        for n in range(5, 10):  # sent while the promotion is under way
                            await client.append("s", [note(f"n{n}")], request_id=f"r{n}")
                        await promotion
                    if ev.seq == 9:
                        break
            repeat = await client.append("s", [note("n7")], request_id="r7")
            stored = [e.seq async for e in client.since("s")]
            return seen, [repeat.events[0].seq, *stored]

    seen, (repeated, *stored) = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert seen == list(range(10))
    assert stored == list(range(10))
    assert repeated == 7


# -- etcd discovery --------------------------------------------------------------------------------


def etcd_put(etcd: EtcdProcess, key: str, value: str) -> None:
    """Put through etcd's JSON gateway (as a leader's campaign would)."""
    body = {"key": _b64(key), "value": _b64(value)}
    request = urllib.request.Request(
        f"http://{etcd.address}/v3/kv/put", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert reply.status == 200


def etcd_delete(etcd: EtcdProcess, key: str) -> None:
    body = {"key": _b64(key)}
    request = urllib.request.Request(
        f"http://{etcd.address}/v3/kv/deleterange", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert reply.status == 200


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


LEADER = "/sessionlog/groups/g1/leader"


def test_etcd_names_the_primary_and_the_new_one_after_a_failover(
    group: tuple[Cluster, Node, Node], tmp_path: Path
) -> None:
    """With only etcd and a group, the client writes where the leader key points; a key naming
    the replica is corrected by its hint; no key means no primary (Unavailable after the
    budget); after a failover the client reads the new leader from etcd."""
    _, primary, replica = group
    with etcd_server(tmp_path / "etcd") as etcd:
        cluster_url = f"etcd://127.0.0.1:1,{etcd.address}"  # the first endpoint is down
        short = Retry(give_up_after=0.5, initial_backoff=0.05, max_backoff=0.1)
        with (
            Client(cluster=cluster_url, group="g1", retry=short) as lost,
            pytest.raises(errors.Unavailable, match="no leader"),
        ):
            lost.append("s", [note("nowhere")])

        etcd_put(etcd, LEADER, primary.address)
        with Client(cluster=cluster_url, group="g1", retry=RETRY) as client:
            client.append("s", [note("n0")], request_id="r0")
            assert client.current == primary.address
            wait_position(replica, primary.status().position)
            primary.kill()
            replica.stop()
            replica.replica_of = ""
            replica.start()
            etcd_put(etcd, LEADER, replica.address)
            # The old primary is down: the client learns the new one from etcd, not a hint.
            client.append("s", [note("n1")], request_id="r1")
            assert client.current == replica.address
            primary.replica_of = replica.address
            primary.start()
            assert contents(client, "s") == [(0, "n0"), (1, "n1")]

        etcd_put(etcd, LEADER, primary.address)  # stale: the old primary, now a replica
        with Client(cluster=cluster_url, group="g1", retry=RETRY) as client:
            client.append("s", [note("n2")])
            assert client.current == replica.address
        etcd_delete(etcd, LEADER)


# -- epochs ----------------------------------------------------------------------------------------


def refused_appends(metrics_port: int) -> float:
    """How many Appends a server refused NOT_PRIMARY, from its /metrics."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    wanted = 'sessionlog_requests_total{method="Append",reason="NOT_PRIMARY"}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(wanted))


def admin_promote(node: Node) -> int:
    """`sessionlog admin promote` against a running replica (no --fence): its new epoch."""
    done = run_cli(["admin", "promote", "--server", node.address, "--json"], node.root)
    assert done.returncode == 0, done.stderr
    epoch: int = json.loads(done.stdout)["epoch"]
    return epoch


def test_clients_never_write_to_a_deposed_primary_once_they_saw_the_newer_epoch(
    group: tuple[Cluster, Node, Node],
) -> None:
    """SIGKILL the primary, promote the replica (admin promote, no fence), and restart the old
    primary unfenced: it still takes writes at epoch 1 from a client that knows no better. The
    sync and asyncio clients have seen epoch 2 on the new primary; while it is down their
    appends meet the old primary, which refuses them (their epoch is above its own): nothing
    lands there, and once the new primary is back every append is stored on it, once."""
    _, old, new = group
    retry = Retry(give_up_after=60.0, initial_backoff=0.05, max_backoff=0.25)
    learnt, go = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    async def async_writer() -> list[int]:
        async with AsyncClient([new.address, old.address], retry=retry) as aclient:
            await aclient.append("a", [note("a0")], request_id="a0")
            assert (aclient.current, aclient.epoch) == (new.address, 2)
            learnt.set()
            await asyncio.to_thread(go.wait, 60)
            return [
                (await aclient.append("a", [note(f"a{n}")], request_id=f"a{n}")).events[0].seq
                for n in (1, 2)
            ]

    def run(name: str, work: Callable[[], object]) -> threading.Thread:
        def target() -> None:
            try:
                outcomes[name] = work()
            except BaseException as error:  # reported by the assertions below
                outcomes[name] = error

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        return thread

    with Client([old.address, new.address], retry=retry) as client:
        client.append("s", [note("n0")], request_id="r0")
        assert (client.current, client.epoch) == (old.address, 1)
        wait_position(new, old.status().position)
        old.kill()
        assert admin_promote(new) == 2
        new.replica_of = ""  # restarts below start it as the primary it now is
        client.append("s", [note("n1")], request_id="r1")  # the old one is down: moves on
        assert (client.current, client.epoch) == (new.address, 2)
        metrics = free_port()
        old.args = ["--metrics-listen", f"127.0.0.1:{metrics}"]
        old.start()  # unfenced, as a primary: it takes writes from anyone who knows no better
        with Client(old.address, wait_for_ready=True) as unaware:  # its channel was refused
            assert unaware.append("elsewhere", [note("x")]).events[0].seq == 0
            assert unaware.epoch == 1
        old_head = old.status().position
        threads = [run("async", lambda: asyncio.run(asyncio.wait_for(async_writer(), 90)))]
        assert learnt.wait(30), outcomes

        new.stop()
        go.set()
        threads.append(
            run(
                "sync",
                lambda: [
                    client.append("s", [note(f"n{n}")], request_id=f"r{n}").events[0].seq
                    for n in (2, 3)
                ],
            )
        )
        time.sleep(1.5)  # every try meets the old primary (refused) or the stopped new one
        assert all(t.is_alive() for t in threads), outcomes
        assert old.status().position == old_head
        assert refused_appends(metrics) >= 2, "neither client tried the old primary"
        new.start()
        for thread in threads:
            thread.join(60)
        assert outcomes == {"sync": [2, 3], "async": [1, 2]}
        assert old.status().position == old_head  # nothing written there once epoch 2 was seen
        assert client.current == new.address
        assert contents(client, "s") == [(n, f"n{n}") for n in range(4)]
        assert [e.seq for e in client.since("a")] == [0, 1, 2]


def connected(client: Client, node: Node) -> None:
    """Wait until ``client``'s channel to a restarted ``node`` is out of its reconnect backoff:
    a stream is not retried, so one opened before would fail UNAVAILABLE."""
    member = next(m for m in client._router.members if m.address == node.address)
    grpc.channel_ready_future(member.channel).result(timeout=15)


def test_append_streams_follow_hints_send_the_epoch_and_refuse_a_deposed_ack(
    group: tuple[Cluster, Node, Node],
) -> None:
    """An append stream (sync, and asyncio for the late ack) does what unary writes do: a
    replica's NOT_PRIMARY moves the client to the primary it names; the epoch is learnt from the
    stream alone; after a promotion a stream to the deposed primary (restarted unfenced) carries
    epoch 2 and is refused, its hint not followed; and an ack that primary gave a client that
    learnt of epoch 2 meanwhile is LeadershipLost (committed), not an acknowledgement."""
    _, old, new = group
    with Client([new.address, old.address], retry=RETRY) as client:
        with client.append_stream() as refused_by_replica:
            sent = refused_by_replica.append_nowait("s", [note("nowhere")], request_id="r0")
        with pytest.raises(errors.NotPrimary):
            sent.result()
        assert client.current == old.address  # the replica's hint, followed
        with client.append_stream() as first:
            assert first.append_nowait("s", [note("n0")], request_id="r0").result().next_seq == 1
        assert client.epoch == 1, "learnt from the stream alone"
        wait_position(new, old.status().position)
        old.kill()
        assert admin_promote(new) == 2
        new.replica_of = ""
        client.append("s", [note("n1")], request_id="r1")  # the old one is down: moves on
        assert (client.current, client.epoch) == (new.address, 2)
        old.start()  # unfenced, as a primary: it takes writes from anyone who knows no better
        old_head = old.status().position

        new.stop()
        with client.append_stream() as broken:
            lost = broken.append_nowait("s", [note("lost")], request_id="r2")
        assert isinstance(lost.exception(), errors.Unavailable)
        assert client.current == old.address  # moved on, as after a unary UNAVAILABLE
        connected(client, old)
        with client.append_stream() as deposed:
            tries = [
                deposed.append_nowait("s", [note("never")], request_id="r2"),
                deposed.append_nowait("t", [note("never")]),
            ]
        for tried in tries:
            refusal = tried.exception()
            assert isinstance(refusal, errors.NotPrimary), refusal
            assert refusal.metadata["epoch"] == "1"
        assert client.current != old.address  # its hint (whom it follows) not taken
        assert old.status().position == old_head  # nothing written there

        async def late_ack() -> tuple[int, BaseException | None]:
            async with AsyncClient(old.address, wait_for_ready=True) as unaware:
                stream = unaware.append_stream()
                async with stream:
                    taken = (await stream.append_nowait("u", [note("taken")])).next_seq
                    assert unaware.epoch == 1, "learnt from the stream's headers"
                    member = unaware._router.members[0]  # a reply of the new primary, elsewhere
                    unaware._router.accepted(member, [("sessionlog-epoch", "2")], "other")
                    after = stream.append_nowait("u", [note("deposed")], request_id="r-u")
                    await asyncio.wait([after])
                return taken, after.exception()

        taken, late = asyncio.run(late_ack())
        assert taken == 1
        assert isinstance(late, errors.LeadershipLost), late
        assert late.committed is True

        with Client(old.address) as direct:
            assert contents(direct, "s") == [(0, "n0")]
        new.start()
        connected(client, new)
        with client.append_stream() as again:
            assert again.append_nowait("s", [note("n2")], request_id="r2").result().next_seq == 3
        assert client.current == new.address
        assert contents(client, "s") == [(0, "n0"), (1, "n1"), (2, "n2")]
