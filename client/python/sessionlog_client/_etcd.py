"""Reading a group's leader from etcd, through etcd's JSON gateway (v3 API, no extra package).

A sessionlog cluster member that leads group NAME holds the key ``/sessionlog/groups/NAME/leader``
(its value: the leader's ``HOST:PORT``) under its etcd lease, so the key exists exactly while a
leader does. The gateway is etcd's own HTTP/JSON face of its gRPC API: ``POST /v3/kv/range``
with the key base64-encoded, answered with ``kvs[0].value`` base64-encoded (no ``kvs`` when the
key is absent). etcd 3.4 (Debian's) and later serve it on the client port.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Sequence

from sessionlog_client.errors import Unavailable

SCHEME = "etcd://"
LEADER_KEY = "/sessionlog/groups/{group}/leader"
SHARDS_KEY = "/sessionlog/shards"
"""The key of the cluster's shard map (JSON), read by ``sessionlog serve --shard-map etcd``."""


def parse_cluster(cluster: str) -> tuple[str, ...]:
    """``etcd://HOST:PORT[,HOST:PORT...]`` (the server's ``--cluster`` form) -> the endpoints."""
    if not cluster.startswith(SCHEME):
        raise ValueError(f"cluster must look like etcd://HOST:PORT[,HOST:PORT...], not {cluster!r}")
    endpoints = tuple(part.strip() for part in cluster[len(SCHEME) :].split(",") if part.strip())
    if not endpoints:
        raise ValueError(f"cluster {cluster!r} names no etcd endpoint")
    return endpoints


def leader_key(group: str) -> str:
    if not group or "/" in group:
        raise ValueError(f"group must be a non-empty name without '/', not {group!r}")
    return LEADER_KEY.format(group=group)


def read_leader(endpoints: Sequence[str], group: str, timeout: float) -> str | None:
    """The leader's ``HOST:PORT`` from the first endpoint that answers; None when the group has
    no leader right now. Raises ``Unavailable`` naming every endpoint when none answers."""
    value = read_key(endpoints, leader_key(group), timeout, f"the leader of group {group!r}")
    if value is None:
        return None
    return value.decode("utf-8").strip() or None


def read_key(endpoints: Sequence[str], key: str, timeout: float, what: str) -> bytes | None:
    """The value of ``key`` from the first endpoint that answers; None when the key is absent.
    Raises ``Unavailable`` naming every endpoint (and ``what`` was read) when none answers."""
    body = json.dumps({"key": _b64(key)}).encode()
    failures = []
    for endpoint in endpoints:
        request = urllib.request.Request(
            f"http://{endpoint}/v3/kv/range",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                answer = json.loads(reply.read())
        except (OSError, ValueError) as error:  # URLError and timeouts are OSErrors
            failures.append(f"{endpoint}: {_reason(error)}")
            continue
        kvs = answer.get("kvs") or []
        if not kvs:
            return None
        return base64.b64decode(kvs[0].get("value", ""))
    raise Unavailable(
        f"cannot read {what} from etcd: {'; '.join(failures)}",
        endpoints=",".join(endpoints),
    )


def _b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _reason(error: Exception) -> str:
    if isinstance(error, urllib.error.URLError) and not isinstance(error, urllib.error.HTTPError):
        return str(error.reason)
    return str(error)
