"""A plain client (no ``shard_map=``) behind HAProxy while `sessionlog cluster move-slot` moves
its sessions' slot: two sharded groups (``--shard-map etcd``, one member each, one real etcd),
HAProxy on the configuration `sessionlog cluster haproxy` writes, kept up to date by
`sessionlog cluster haproxy-sync` (in a thread, as `dev cluster` runs it).

During the freeze the slot's writes are answered SLOT_MOVING; after the flip, until the sync
has applied the new map (about a second), HAProxy still sends them to the old group, which
answers WRONG_GROUP. Neither refusal wrote anything, and the client retries both: the writer
sees no error, every acknowledged append is in the new group at its seq, and a follow stream
open through HAProxy goes on across the move and delivers each of them once.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from sessionlog.cluster.etcd import Endpoints
from sessionlog.shard import haproxy, hasync
from sessionlog.shard.shardmap import SHARDS_KEY, Group, ShardMap
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from sessionlog_client import AsyncClient, Client, event
from tests.cluster._etcd import EtcdProcess
from tests.cluster.test_haproxy import _haproxy, _stop
from tests.cluster.test_move_slot import ids_of_slot, primary_of, said
from tests.e2e._proc import ServerProcess, clean_env, free_port, run_cli


@dataclass
class Front:
    etcd: EtcdProcess
    map: ShardMap
    address: str
    """HAProxy's."""
    root: Path


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    root = tmp_path_factory.mktemp("move-haproxy")
    with EtcdProcess(root / "etcd") as etcd:
        members = {name: f"127.0.0.1:{free_port()}" for name in ("g1", "g2")}
        http = {name: f"127.0.0.1:{free_port()}" for name in members}
        halves = {"g1": ((0, 511),), "g2": ((512, 1023),)}
        first = ShardMap(
            1, tuple(Group(n, (a,), halves[n], (http[n],)) for n, a in members.items())
        )
        endpoints = Endpoints((etcd.endpoint,), 2.0)
        endpoints.put(SHARDS_KEY, first.to_json().encode(), 0)
        endpoints.close()
        servers = []
        proxy = None
        stop = threading.Event()
        sync = None
        try:
            for name, address in members.items():
                args = [
                    "--data", str(root / name), "--listen", address, "--advertise", address,
                    "--http-listen", http[name], "--cluster", f"etcd://{etcd.endpoint}",
                    "--group", name, "--shard-map", "etcd", "--log-format", "json",
                ]  # fmt: skip
                servers.append(ServerProcess(args, root, env=clean_env(workers=False)).start())
            for server, address in zip(servers, members.values(), strict=True):
                server.wait_serving(address, timeout=60)
            for name, address in members.items():
                primary_of(name, [address])
            address = f"127.0.0.1:{free_port()}"
            out = root / "proxy"
            config, _ = haproxy.write(first, out, address, 5.0, 0.3)
            proxy = _haproxy(config, root / "haproxy.log")
            hasync.wait_socket(str(out / haproxy.SOCKET_FILE), 10.0)
            flags = argparse.Namespace(
                cluster=f"etcd://{etcd.endpoint}", out=str(out), socket=None, once=False
            )
            sync = threading.Thread(target=hasync.run, args=(flags, stop), daemon=True)
            sync.start()
            yield Front(etcd, first, address, root)
        finally:
            stop.set()
            if sync is not None:
                sync.join(10)
            if proxy is not None:
                _stop(proxy)
            for server in servers:
                server.stop()


class PlainWriter(threading.Thread):
    """Appends round robin through HAProxy with a client given one address and no shard map."""

    def __init__(self, address: str, sessions: list[str]) -> None:
        super().__init__(daemon=True)
        self.client = Client(address, timeout=10)
        self.sessions = sessions
        self.acked: list[tuple[str, int, str]] = []
        self.failed: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        for n in range(100_000):  # bounded; stopped long before
            if self.stop.is_set():
                return
            session = self.sessions[n % len(self.sessions)]
            content = f"{session}#{n}"
            try:
                reply = self.client.append(session, [event("user_message", {"content": content})])
            except Exception as exc:  # an unacknowledged append: what this test rules out
                self.failed.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)
                continue
            self.acked.append((session, reply.events[0].seq, content))
            time.sleep(0.005)


class AsyncPlainWriter(PlainWriter):
    """The same through an AsyncClient, on an event loop of its own."""

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        async with AsyncClient(self.client.connection.target, timeout=10) as client:
            for n in range(100_000):
                if self.stop.is_set():
                    return
                session = self.sessions[n % len(self.sessions)]
                content = f"{session}@{n}"
                try:
                    reply = await client.append(
                        session, [event("user_message", {"content": content})]
                    )
                except Exception as exc:
                    self.failed.append(f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.05)
                    continue
                self.acked.append((session, reply.events[0].seq, content))
                await asyncio.sleep(0.005)


class Follower(threading.Thread):
    """Follows one session through HAProxy with a plain client, from seq 0."""

    def __init__(self, address: str, session: str) -> None:
        super().__init__(daemon=True)
        self.client = Client(address, timeout=None)
        self.stream = self.client.follow(session)
        self.seen: list[tuple[int, str]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for item in self.stream:
                self.seen.append((item.seq, said(item)))
        except BaseException as exc:
            self.error = exc


def test_a_plain_client_behind_haproxy_sees_no_refusal_during_a_move(front: Front) -> None:
    slot = front.map.group("g1").ranges[0][0] + 5
    sessions = ids_of_slot(slot, 4, "px-")
    with Client(front.address, timeout=10) as client:
        for session in sessions:
            client.append(session, [event("user_message", {"content": f"{session}#first"})])
    follower = Follower(front.address, sessions[0])
    follower.start()
    writer = PlainWriter(front.address, sessions)
    writer.start()
    aio = AsyncPlainWriter(front.address, sessions)
    aio.start()
    try:
        time.sleep(0.5)
        done = run_cli(
            ["cluster", "move-slot", str(slot), "--to", "g2", "--cluster", f"etcd://{front.etcd.endpoint}"],
            front.root,
            timeout=90,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        time.sleep(2.0)  # past the sync's next poll: the writer keeps going at the new owner
    finally:
        for each in (writer, aio):
            each.stop.set()
            each.join(60)
    assert not writer.is_alive()
    assert not aio.is_alive()
    acked = writer.acked + aio.acked
    print(f"\n{done.stdout}{len(acked)} appends acknowledged (sync and asyncio clients)")
    assert not writer.failed, writer.failed[:3]
    assert not aio.failed, aio.failed[:3]
    assert len(aio.acked) > 10
    owner = front.map.group("g2").members[0]
    with grpc.insecure_channel(owner) as channel:
        stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
        for session in sessions:
            stored = [
                e
                for reply in stub.Since(pb.SinceRequest(session_id=session), timeout=10)
                for e in reply.events
            ]
            contents = [said(e) for e in stored]
            assert [e.seq for e in stored] == list(range(len(stored)))
            assert len(set(contents)) == len(contents)  # nothing written twice
            for s, seq, text in acked:
                if s == session:
                    assert contents[seq] == text, (session, seq)
    last = max(seq for s, seq, _ in acked if s == sessions[0])
    deadline = time.monotonic() + 30
    while (not follower.seen or follower.seen[-1][0] < last) and follower.error is None:
        assert time.monotonic() < deadline, follower.seen[-3:]
        time.sleep(0.05)
    follower.stream.close()
    follower.join(10)
    assert follower.error is None, follower.error
    assert [seq for seq, _ in follower.seen] == list(range(len(follower.seen)))
    first = {seq: text for s, seq, text in acked if s == sessions[0]}
    assert all(dict(follower.seen)[seq] == text for seq, text in first.items())
    follower.client.close()
    writer.client.close()
    aio.client.close()
