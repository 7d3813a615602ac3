"""Retention (issue 17 part 3b): when a session is due for deletion, and the rules its expiry
values follow. Pure: no grpc, no lmdb, no clock (every "now" is an argument).

Decisions:
- A session expires at its ``expire_time`` (set at create from an absolute time or a ttl, or
  with UpdateSession), or, under the server policy ``--retention-idle``, once its update time
  (the later of its last append and its last UpdateSession) is older than the idle duration.
  Default: neither, so a session is kept forever.
- Appending does not move ``expire_time``: an expiry is a promise made when it was set. A TTL
  counted from the last activity is what the idle policy is for.
- A pinned session is exempt from both (a legal hold); only an explicit DeleteSession or
  EraseSessions removes it.
- The sweeper decides twice: once from an index outside the writer, and again with ``due``
  inside the delete's own write transaction, so an expiry extended or a pin set in between
  wins over a sweep that had already picked the session.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from sessionlog import errors

NS = 1_000_000_000
MAX_AHEAD_NS = 100 * 365 * 86_400 * NS
"""The furthest an expiry may lie ahead (about 100 years): a ttl or expire_time past it is a
mistake (a unit confused), not a retention period."""

EXPIRED = "expired"
IDLE = "retention policy"
"""The erasure audit's reasons for the two kinds of retention delete."""
ACTOR = "retention"
"""The erasure audit's actor of a sweeper delete."""


@dataclass(frozen=True)
class Policy:
    """The server's retention settings."""

    idle_ns: int = 0
    """Delete an unpinned session whose update time is older than this (0: never)."""


def due(
    *, expire_time_ns: int, pinned: bool, update_time_ns: int, now_ns: int, policy: Policy
) -> str | None:
    """Why a session is to be deleted at ``now_ns`` (``EXPIRED`` or ``IDLE``), or None."""
    if pinned:
        return None
    if expire_time_ns and expire_time_ns <= now_ns:
        return EXPIRED
    if policy.idle_ns and update_time_ns + policy.idle_ns <= now_ns:
        return IDLE
    return None


def expire_at(now_ns: int, *, expire_time_ns: int = 0, ttl_ns: int | None = None) -> int:
    """The expiry a request asks for (0: none), checked: an absolute time after ``now_ns``, or
    ``now_ns`` plus a ttl above 0; either at most ``MAX_AHEAD_NS`` ahead."""
    if ttl_ns is not None:
        if ttl_ns <= 0:
            raise errors.InvalidExpiration(
                f"a ttl must be above 0 (got {ttl_ns / NS:g} s); to keep the session forever, "
                "give it no expiry",
                field="ttl",
            )
        if ttl_ns > MAX_AHEAD_NS:
            raise errors.InvalidExpiration(
                f"a ttl is at most 100 years (got {ttl_ns / NS:g} s)", field="ttl"
            )
        return now_ns + ttl_ns
    if not expire_time_ns:
        return 0
    if expire_time_ns <= now_ns:
        raise errors.InvalidExpiration(
            "expire_time is not in the future; pick a later time, or delete the session now "
            "with DeleteSession",
            field="expire_time",
        )
    if expire_time_ns - now_ns > MAX_AHEAD_NS:
        raise errors.InvalidExpiration(
            "expire_time is more than 100 years ahead", field="expire_time"
        )
    return expire_time_ns


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_NS = {"ms": NS // 1000, "s": NS, "m": 60 * NS, "h": 3600 * NS, "d": 86_400 * NS}
_UNIT_NS["w"] = 7 * _UNIT_NS["d"]


def parse_duration(text: object) -> int:
    """A duration as ns: a number of seconds, or a number with a unit ms, s, m, h, d or w
    ("90s", "12h", "7d", "1.5h"). ValueError for anything else."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, int | float):
        if not math.isfinite(text) or text < 0:
            raise ValueError(f"not a duration: {text!r} (a duration is not negative)")
        return round(text * NS)
    match = _DURATION.match(str(text))
    if match is None:
        raise ValueError(f"not a duration: {text!r} (try 90s, 30m, 12h, 7d or 2w)")
    return round(float(match.group(1)) * _UNIT_NS[match.group(2) or "s"])
