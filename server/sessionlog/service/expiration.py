"""Retention fields of requests (``sessionlog.retention``): the expiry a CreateSession asks for,
its retry fingerprint, and UpdateSession's retention paths, turned into what the store takes.

The service, not the store, turns a ttl into a time: the request's ttl is measured from when the
server received it (``time.time_ns()`` here), and the store is given an absolute expire_time.
"""

from __future__ import annotations

import time

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from sessionlog import errors, retention
from sessionlog.records import SessionRecord
from sessionlog.v1 import session_log_service_pb2 as pb


def expire_ns(stamp: Timestamp, field: str = "expire_time") -> int:
    """An expire_time as ns: a valid Timestamp (nanos in [0, 1e9), years 1-9999) after 1970,
    else INVALID_EXPIRATION (a time at or before 1970 is in the past, not "no expiry")."""
    try:
        ns: int = stamp.ToNanoseconds()
    except ValueError as error:
        raise errors.InvalidExpiration(f"{field}: {error}", field=field) from None
    return max(ns, 1)


def ttl_ns(duration: Duration, field: str = "ttl") -> int:
    """A ttl as ns: a valid Duration (nanos within a second, of the seconds' sign)."""
    seconds, nanos = duration.seconds, duration.nanos
    if not -1_000_000_000 < nanos < 1_000_000_000 or (seconds > 0 > nanos or seconds < 0 < nanos):
        raise errors.InvalidExpiration(
            f"{field} is not a valid Duration: nanos {nanos} must lie within a second and share "
            f"the sign of seconds {seconds}",
            field=field,
        )
    ns: int = duration.ToNanoseconds()
    return ns


def requested(request: pb.CreateSessionRequest) -> int:
    """The expiry a CreateSession asks for, as ns (0: none), checked against now."""
    which = request.WhichOneof("expiration")
    now_ns = time.time_ns()
    if which == "ttl":
        return retention.expire_at(now_ns, ttl_ns=ttl_ns(request.ttl))
    if which == "expire_time":
        return retention.expire_at(now_ns, expire_time_ns=expire_ns(request.expire_time))
    return 0


def asked(request: pb.CreateSessionRequest) -> str:
    """A CreateSession's expiry as the request states it, for its retry fingerprint."""
    if request.WhichOneof("expiration") == "ttl":
        return f"ttl={ttl_ns(request.ttl)}"
    return f"at={expire_ns(request.expire_time)}"


def update_paths(given: pb.Session, record: SessionRecord, paths: list[str]) -> list[str]:
    """UpdateSession's retention paths: "ttl" becomes "expire_time" at now + ttl, and the
    expiry and pin asked for are checked and put on ``record``. Other paths pass as they are."""
    if "ttl" in paths and "expire_time" in paths:
        raise errors.InvalidExpiration(
            'update_mask names both "ttl" and "expire_time"; name one', field="ttl"
        )
    now_ns = time.time_ns()
    if "ttl" in paths:
        if not given.HasField("ttl"):
            raise errors.InvalidExpiration(
                'update_mask names "ttl" but session.ttl is unset; set it, or clear the expiry '
                'with the path "expire_time" and no session.expire_time',
                field="ttl",
            )
        record.expire_time_ns = retention.expire_at(now_ns, ttl_ns=ttl_ns(given.ttl))
        paths = ["expire_time" if path == "ttl" else path for path in paths]
    elif "expire_time" in paths and given.HasField("expire_time"):
        at = expire_ns(given.expire_time)
        record.expire_time_ns = retention.expire_at(now_ns, expire_time_ns=at)
    record.pinned = given.pinned
    return paths
