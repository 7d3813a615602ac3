"""The settings of a cluster member, parsed and checked: ``--cluster``, ``--group``,
``--advertise``, ``--lease-ttl``.

    --cluster etcd://10.0.0.5:2379,10.0.0.6:2379   the etcd endpoints (any member of one cluster)
    --group orders                                 the group's keys: /sessionlog/groups/orders/
    --advertise 10.0.0.21:50051                    where the others (replicas, clients) reach me
    --lease-ttl 5                                  whole seconds; etcd's own floor is 2

Each ``parse_*`` function takes one setting's text and returns its value or raises ValueError
saying what is wrong (the shape ``config.Setting.parse`` has); ``cluster_settings`` checks them
together and raises ``ConfigError``. ``config`` declares them as settings of `sessionlog
serve` with these parsers (``ServerConfig.cluster_settings``); ``cluster.member`` acts on them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from sessionlog.defaults import DEFAULT_LEASE_TTL_SECONDS as DEFAULT_LEASE_TTL_SECONDS
from sessionlog.defaults import ConfigError

MIN_LEASE_TTL_SECONDS = 2
"""etcd's floor with its default election timeout (1 s): a shorter TTL is silently raised to
it, and the self-fence deadline would then be computed from a TTL etcd does not apply."""
MAX_LEASE_TTL_SECONDS = 600
"""Past ten minutes a failover is an outage, whatever the TTL is meant to save."""
SCHEME = "etcd://"

_GROUP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


@dataclass(frozen=True, order=True)
class Endpoint:
    """One etcd client address (its gRPC port, which also serves the JSON gateway)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ClusterSettings:
    """What a member needs to take part in a group; see the module docstring."""

    endpoints: tuple[Endpoint, ...]
    group: str
    advertise: str
    lease_ttl: int = DEFAULT_LEASE_TTL_SECONDS
    member_id: str = ""
    """The member's name under ``members/``; empty means its advertise address."""

    @property
    def name(self) -> str:
        return self.member_id or self.advertise


def _host_port(text: str, what: str) -> tuple[str, int]:
    """HOST:PORT or [IPv6]:PORT, port 1 to 65535."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ValueError(f"{what} {text!r} is not [IPv6]:PORT")
        port_text = rest[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon or ":" in host:
            raise ValueError(f"{what} {text!r} is not HOST:PORT (an IPv6 host goes in [])")
    if not host or any(c.isspace() or c in "/?#@" for c in host):
        raise ValueError(f"{what} {text!r} has no usable host")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{what} {text!r} needs a port from 1 to 65535")
    return host, int(port_text)


def parse_cluster(value: Any) -> tuple[Endpoint, ...]:
    """``etcd://HOST:PORT[,HOST:PORT...]`` into its endpoints, in the order given (the order a
    member tries them in); the empty text means no cluster."""
    if not isinstance(value, str):
        raise ValueError(f"must be text like etcd://127.0.0.1:2379, not {value!r}")
    text = value.strip()
    if not text:
        return ()
    if not text.startswith(SCHEME):
        scheme = text.partition("://")[0] if "://" in text else ""
        hint = f" ({scheme}:// is not supported)" if scheme else ""
        raise ValueError(f"{value!r} must start with {SCHEME}{hint}, e.g. etcd://127.0.0.1:2379")
    endpoints: list[Endpoint] = []
    for part in text[len(SCHEME) :].split(","):
        endpoint = Endpoint(*_host_port(part.strip(), "the etcd endpoint"))
        if endpoint in endpoints:
            raise ValueError(f"the etcd endpoint {endpoint} is listed twice in {value!r}")
        endpoints.append(endpoint)
    return tuple(endpoints)


def parse_group(value: Any) -> str:
    """A group name: 1 to 63 letters, digits, ``.``, ``_`` or ``-``, starting with a letter or
    digit (it is one segment of an etcd key: no ``/``)."""
    if not isinstance(value, str) or (value and not _GROUP.match(value)):
        raise ValueError(
            f"must be 1 to 63 letters, digits, '.', '_' or '-' (starting with a letter or digit), "
            f"not {value!r}"
        )
    return value


def parse_advertise(value: Any) -> str:
    """HOST:PORT that the other members and the clients can connect to: not a wildcard address
    and not port 0 (both are fine to listen on, and useless to be told about)."""
    if not isinstance(value, str):
        raise ValueError(f"must be HOST:PORT, not {value!r}")
    if not value:
        return value
    host, port = _host_port(value, "the advertise address")
    if host in ("0.0.0.0", "::", "*"):
        raise ValueError(
            f"{value!r} is a wildcard: advertise the address others reach this member at"
        )
    return value if ":" not in host else f"[{host}]:{port}"


def parse_lease_ttl(value: Any) -> int:
    """Whole seconds (etcd's lease TTLs are whole seconds), MIN to MAX_LEASE_TTL_SECONDS."""
    bad = ValueError(
        f"must be a whole number of seconds from {MIN_LEASE_TTL_SECONDS} to "
        f"{MAX_LEASE_TTL_SECONDS}, not {value!r}"
    )
    if isinstance(value, bool):
        raise bad
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise bad from None
    if not math.isfinite(number) or not number.is_integer():
        raise bad
    if not MIN_LEASE_TTL_SECONDS <= number <= MAX_LEASE_TTL_SECONDS:
        raise bad
    return int(number)


def cluster_settings(
    cluster: Any = "",
    group: Any = "",
    advertise: Any = "",
    lease_ttl: Any = DEFAULT_LEASE_TTL_SECONDS,
) -> ClusterSettings | None:
    """The four settings checked together: None when no ``cluster`` is given (and nothing that
    needs one), else the settings; ConfigError naming the flag to change otherwise."""
    values: dict[str, Any] = {}
    for name, parse, raw in (
        ("cluster", parse_cluster, cluster),
        ("group", parse_group, group),
        ("advertise", parse_advertise, advertise),
        ("lease-ttl", parse_lease_ttl, lease_ttl),
    ):
        try:
            values[name] = parse(raw)
        except ValueError as exc:
            raise ConfigError(f"--{name}: {exc}") from None
    if not values["cluster"]:
        given = [f"--{n}" for n in ("group", "advertise") if values[n]]
        if given:
            raise ConfigError(f"{' and '.join(given)} need --cluster etcd://HOST:PORT")
        return None
    missing = [f"--{n}" for n in ("group", "advertise") if not values[n]]
    if missing:
        raise ConfigError(
            f"--cluster needs {' and '.join(missing)}: the group names the keys the members "
            "share, the advertise address is where the others reach this member"
        )
    return ClusterSettings(
        endpoints=values["cluster"],
        group=values["group"],
        advertise=values["advertise"],
        lease_ttl=values["lease-ttl"],
    )
