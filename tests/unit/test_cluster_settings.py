"""--cluster, --group, --advertise and --lease-ttl: what parses, what is refused and how the
refusal reads."""

from __future__ import annotations

import re

import pytest

from sessionlog.cluster.settings import (
    DEFAULT_LEASE_TTL_SECONDS,
    ClusterSettings,
    Endpoint,
    cluster_settings,
    parse_advertise,
    parse_cluster,
    parse_group,
    parse_lease_ttl,
)
from sessionlog.config import ConfigError


def test_several_endpoints_keep_their_order() -> None:
    """The order given is the order a member tries them in."""
    assert parse_cluster("etcd://10.0.0.6:2379, 10.0.0.5:2379,[::1]:2379") == (
        Endpoint("10.0.0.6", 2379),
        Endpoint("10.0.0.5", 2379),
        Endpoint("::1", 2379),
    )
    assert str(Endpoint("::1", 2379)) == "[::1]:2379"
    assert parse_cluster("") == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("http://127.0.0.1:2379", "must start with etcd:// (http:// is not supported)"),
        ("127.0.0.1:2379", "must start with etcd://"),
        ("etcd://127.0.0.1", "is not HOST:PORT"),
        ("etcd://127.0.0.1:0", "needs a port from 1 to 65535"),
        ("etcd://127.0.0.1:70000", "needs a port from 1 to 65535"),
        ("etcd://:2379", "has no usable host"),
        ("etcd://h:2379/path", "needs a port"),
        ("etcd://h:1,h:1", "listed twice"),
        ("etcd://h:1,", "is not HOST:PORT"),
        ("etcd://::1:2379", "an IPv6 host goes in []"),
    ],
)
def test_a_bad_cluster_address_is_refused_saying_why(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_cluster(text)


def test_group_names_are_one_key_segment() -> None:
    assert parse_group("orders-eu.1_b") == "orders-eu.1_b"
    for bad in ("a/b", "-a", "a" * 64, "über", " a"):
        with pytest.raises(ValueError, match="letters, digits"):
            parse_group(bad)


def test_the_advertise_address_must_be_reachable() -> None:
    """A wildcard or port 0 is fine to listen on and useless to be told about."""
    assert parse_advertise("10.0.0.21:50051") == "10.0.0.21:50051"
    assert parse_advertise("[::1]:50051") == "[::1]:50051"
    with pytest.raises(ValueError, match="wildcard"):
        parse_advertise("0.0.0.0:50051")
    with pytest.raises(ValueError, match="wildcard"):
        parse_advertise("[::]:50051")
    with pytest.raises(ValueError, match="port from 1"):
        parse_advertise("10.0.0.21:0")


def test_the_lease_ttl_is_whole_seconds_within_etcds_range() -> None:
    assert parse_lease_ttl("5") == 5
    assert parse_lease_ttl(2) == 2
    assert parse_lease_ttl(600.0) == 600
    for bad in ("1", 1, "2.5", "601", "five", True, "nan", "inf", None):
        with pytest.raises(ValueError, match="whole number of seconds from 2 to 600"):
            parse_lease_ttl(bad)


def test_the_settings_together() -> None:
    """All four make a member's settings; the member's name defaults to its address."""
    made = cluster_settings("etcd://127.0.0.1:2379", "g", "127.0.0.1:7001", "3")
    assert made == ClusterSettings((Endpoint("127.0.0.1", 2379),), "g", "127.0.0.1:7001", 3)
    assert made.name == "127.0.0.1:7001"
    assert cluster_settings() is None
    default = cluster_settings("etcd://h:1", "g", "h:2")
    assert default is not None
    assert default.lease_ttl == DEFAULT_LEASE_TTL_SECONDS


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"group": "g"}, "--group need --cluster etcd://HOST:PORT"),
        ({"group": "g", "advertise": "h:1"}, "--group and --advertise need --cluster"),
        ({"cluster": "etcd://h:1"}, "--cluster needs --group and --advertise"),
        ({"cluster": "etcd://h:1", "group": "g"}, "--cluster needs --advertise"),
        (
            {"cluster": "etcd://h:1", "group": "g", "advertise": "h:2", "lease_ttl": 1},
            "--lease-ttl: must",
        ),
        ({"cluster": "etcd://h", "group": "g", "advertise": "h:2"}, "--cluster: the etcd endpoint"),
    ],
)
def test_settings_that_do_not_go_together_name_the_flag(
    values: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        cluster_settings(**values)
    assert message in str(raised.value)
