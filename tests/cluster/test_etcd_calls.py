"""The etcd calls the election is built from, against a real etcd: the campaign transaction's
two guards, the lease's life, and an endpoint list that starts with dead ones."""

from __future__ import annotations

import time

import pytest

from sessionlog.cluster.election import read_leader
from sessionlog.cluster.etcd import (
    Endpoints,
    EtcdError,
    EtcdUnavailable,
    compare_created,
    compare_unchanged_since,
    request_put,
)
from sessionlog.cluster.members import GroupKeys, MemberRecord, Progress
from sessionlog.cluster.settings import Endpoint
from tests.cluster._etcd import EtcdProcess
from tests.e2e._proc import free_port

KEYS = GroupKeys("calls")


def campaign(etcd: Endpoints, revision: int, lease: int, address: str) -> tuple[bool, int]:
    body = {
        "compare": [
            compare_created(KEYS.leader, 0),
            compare_unchanged_since(KEYS.members, KEYS.members_end, revision),
        ],
        "success": [request_put(KEYS.leader, address.encode(), lease)],
        "failure": [],
    }
    won, at, _ = etcd.txn(body)
    return won, at


def test_the_campaign_fails_when_a_member_record_changed_since_the_read(
    etcd: EtcdProcess,
) -> None:
    """A member that published after the candidate read ``members/`` (it caught up, or it
    joined) makes the candidate's transaction fail; read again, it succeeds, and the leader
    key's create_revision is the transaction's revision: the epoch."""
    client = Endpoints((etcd.endpoint,), timeout=2.0)
    try:
        lease, ttl = client.grant(5)
        assert ttl == 5
        client.put(KEYS.member("a"), MemberRecord("a", "h:1", Progress()).encode(), lease)
        _, revision = client.get_range(KEYS.members, KEYS.members_end)
        client.put(KEYS.member("b"), MemberRecord("b", "h:2", Progress(0, 3)).encode(), lease)
        assert campaign(client, revision, lease, "h:1") == (False, revision + 1)
        assert read_leader(client, "calls") is None
        kvs, revision = client.get_range(KEYS.members, KEYS.members_end)
        assert [kv.key for kv in kvs] == [KEYS.member("a"), KEYS.member("b")]
        won, epoch = campaign(client, revision, lease, "h:1")
        assert won
        assert read_leader(client, "calls") == ("h:1", epoch)
        # Present now: a second campaign fails on the leader key alone.
        _, revision = client.get_range(KEYS.members, KEYS.members_end)
        assert campaign(client, revision, lease, "h:2")[0] is False
        client.revoke(lease)
        assert read_leader(client, "calls") is None
        assert client.get_range(KEYS.members, KEYS.members_end)[0] == []
        assert client.keepalive(lease) == -1
        with pytest.raises(EtcdError):
            client.put(KEYS.member("a"), b"{}", lease)
    finally:
        client.close()


def test_a_lease_without_keepalive_takes_its_keys_with_it(etcd: EtcdProcess) -> None:
    """etcd's floor is 2 s: a lease granted for 2 s and never renewed is gone within 2 s plus
    etcd's expiry sweep, and the leader key attached to it with it."""
    client = Endpoints((etcd.endpoint,), timeout=2.0)
    try:
        lease, _ = client.grant(2)
        won, _ = campaign(client, client.get_range(KEYS.members, KEYS.members_end)[1], lease, "x:1")
        assert won
        deadline = time.monotonic() + 6
        while read_leader(client, "calls") is not None:
            assert time.monotonic() < deadline, "the leader key outlived its lease"
            time.sleep(0.1)
    finally:
        client.close()


def test_dead_endpoints_are_passed_over_and_none_alive_is_unavailable(etcd: EtcdProcess) -> None:
    """A closed port first: the call lands on etcd, which becomes the endpoint tried first;
    with only closed ports, EtcdUnavailable names each."""
    dead = Endpoint("127.0.0.1", free_port())
    client = Endpoints((dead, etcd.endpoint), timeout=1.0)
    try:
        assert client.current == str(dead)
        client.get(KEYS.leader)
        assert client.current == str(etcd.endpoint)
    finally:
        client.close()
    nobody = Endpoints((dead, Endpoint("127.0.0.1", free_port())), timeout=1.0)
    try:
        with pytest.raises(EtcdUnavailable, match="no etcd endpoint answered") as raised:
            nobody.get(KEYS.leader)
        assert str(dead) in str(raised.value)
    finally:
        nobody.close()
