"""1,000 sessions written through a real HAProxy into two static groups: each session's events
live in exactly one group (its predicted one, on both of its members), and a listing through
HAProxy names every session exactly once.

The set-up: two groups (`sessionlog serve --shard-map FILE --group G`), each a primary and a read
replica with --http-listen (HAProxy's health checks), the configuration `sessionlog cluster
haproxy` writes for their map in front; the Python client (which sends ``x-session-id``,
percent-encoded for a non-ASCII id, that HAProxy url-decodes) writes from a bounded pool of
threads. Each group's store is then read member by member (ListSessions with the
``x-sessionlog-scope: group`` header: that member's own sessions, with their event counts).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from sessionlog.shard import haproxy
from sessionlog.shard.shardmap import Group, ShardMap
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog_client import Client, Retry, errors, event
from tests.e2e._proc import free_port
from tests.e2e._replication_cluster import Cluster, Node

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
SESSIONS = 1000
WRITERS = 8
"""The pool of writer threads (one client, shared)."""
PAGE = 100
CALL = 20.0
SCOPE = ("x-sessionlog-scope", "group")
GROUPS = {"g1": ((0, 511),), "g2": ((512, 1023),)}


def session_ids() -> list[str]:
    """1,000 ids, one in ten not plain ASCII (accents, CJK, Greek, a combining mark: what the
    clients percent-encode)."""
    special = ("sitzung-ü-{}", "会话-{}", "cafe\u0301.{}", "ça_va-{}", "Ωmega-{}")
    return [
        special[n // 10 % len(special)].format(n) if n % 10 == 0 else f"session-{n:04d}"
        for n in range(SESSIONS)
    ]


def _http(node: Node) -> str:
    return next(a for f, a in zip(node.args, node.args[1:], strict=False) if f == "--http-listen")


def _eventually(check: Callable[[], Any], seconds: float = 30.0) -> Any:
    """``check()``'s first truthy value within ``seconds`` (tried every 0.1 s), else fail."""
    deadline = time.monotonic() + seconds
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (grpc.RpcError, errors.Unavailable) as error:
            last = error
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds}s: {last}")


def held(node: Node) -> dict[str, int]:
    """The sessions ``node``'s own store holds (a group-scoped listing): id -> event count."""
    found: dict[str, int] = {}
    token = ""
    for _ in range(100):
        reply = node.stub().ListSessions(
            pb.ListSessionsRequest(page_size=1000, page_token=token),
            metadata=(SCOPE,),
            timeout=CALL,
        )
        found.update((s.session_id, s.event_count) for s in reply.sessions)
        token = reply.next_page_token
        if not token:
            return found
    raise AssertionError(f"{node.name}'s listing did not end within 100 pages")


def holds(node: Node, sessions: dict[str, int]) -> bool:
    """``node``'s store holds exactly these sessions, with these event counts."""
    return held(node) == sessions


@dataclass
class Routed:
    map: ShardMap
    nodes: dict[str, tuple[Node, Node]]
    """Group name: (primary, replica)."""
    address: str
    """HAProxy's."""


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routed]:
    if not Path(HAPROXY).exists():
        pytest.fail("haproxy is not installed: run `make haproxy-tools` (apt-get install haproxy)")
    root = tmp_path_factory.mktemp("thousand")
    ports = {name: (free_port(), free_port()) for name in GROUPS}
    https = {name: (f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}") for name in GROUPS}
    shard_map = ShardMap(
        1,
        tuple(
            Group(name, tuple(f"127.0.0.1:{p}" for p in ports[name]), GROUPS[name], https[name])
            for name in GROUPS
        ),
    )
    map_file = root / "shards.toml"
    map_file.write_text(shard_map.to_toml())
    with Cluster(root) as cluster:
        nodes: dict[str, tuple[Node, Node]] = {}
        for name in GROUPS:

            def args(http: str, name: str = name) -> list[str]:
                return ["--http-listen", http, "--shard-map", str(map_file), "--group", name]

            primary = cluster.primary(
                f"{name}-primary", port=ports[name][0], args=args(https[name][0])
            )
            replica = Node(root, f"{name}-replica", port=ports[name][1], replica_of=primary.address,
                           args=args(https[name][1]))  # fmt: skip
            cluster.nodes.append(replica)
            replica.start()
            nodes[name] = (primary, replica)
        address = f"127.0.0.1:{free_port()}"
        config, _ = haproxy.write(shard_map, root / "proxy", address, 10.0, 0.3)
        with (root / "haproxy.log").open("ab") as log:
            process = subprocess.Popen(
                [HAPROXY, "-db", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            yield Routed(shard_map, nodes, address)
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def write(client: Client, session_id: str) -> int:
    """Two appends (two events, then one), each with a request id of its own; the next seq."""
    said = [event("user_message", {"content": f"{session_id} {i}"}) for i in range(3)]
    client.append(session_id, said[:2], request_id=f"{session_id}/a", expected_seq=0)
    reply = client.append(session_id, said[2:], request_id=f"{session_id}/b", expected_seq=2)
    return int(reply.next_seq)


def test_each_session_lives_in_one_group_and_is_listed_once(routed: Routed) -> None:
    """Every session on both members of its group and on no other member, with its three
    events; a listing through HAProxy (pages of 100) names each of the 1,000 once, in id
    order; the non-ASCII ones read back through HAProxy."""
    shard_map, nodes, address = routed.map, routed.nodes, routed.address
    ids = session_ids()
    owner = {s: shard_map.owner(s).name for s in ids}
    for name in GROUPS:  # the ids of both kinds spread over both groups
        assert sum(o == name for o in owner.values()) > SESSIONS // 3
        assert any(not s.isascii() for s in ids if owner[s] == name)
    started = time.monotonic()
    first = {name: next(s for s in ids if owner[s] == name) for name in GROUPS}
    with Client(address, retry=Retry(give_up_after=30.0), timeout=CALL) as client:
        # Both write backends up (HAProxy's first checks). One client writes to both groups:
        # it keeps each group's epoch apart (g2 is at epoch 0 until its first write, while the
        # client has seen g1's 1).
        for session_id in first.values():
            _eventually(functools.partial(write, client, session_id))
        rest = [s for s in ids if s not in first.values()]
        with ThreadPoolExecutor(WRITERS) as pool:
            list(pool.map(lambda s: write(client, s), rest))
        wrote = time.monotonic() - started
        for name, members in nodes.items():
            want = {s: 3 for s in ids if owner[s] == name}
            for node in members:  # the replica once it has applied everything
                _eventually(functools.partial(holds, node, want))
        pages = [
            [s.session_id for s in page.sessions]
            for page in client.list_sessions(page_size=PAGE, timeout=CALL)
        ]
        listed = [s for page in pages for s in page]
        assert len(listed) == SESSIONS
        assert listed == sorted(ids, key=lambda s: s.encode()), "each once, in id order"
        assert all(len(page) <= PAGE for page in pages)
        assert len(pages) >= SESSIONS // PAGE
        for session_id in [s for s in ids if not s.isascii()][:20]:  # read back through HAProxy
            contents = [e.data["content"] for e in client.since(session_id)]
            assert contents == [f"{session_id} {i}" for i in range(3)]
    print(f"\n{SESSIONS} sessions written through HAProxy in {wrote:.1f} s")
