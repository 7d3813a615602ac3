"""Retention's pure rules: when a session is due, what an expiry request may ask, durations,
the retention paths of UpdateSession's mask, the ListSessions terms on pinned and expire_time,
and the stored record keeping both fields."""

from __future__ import annotations

import pytest

from sessionlog import errors, records, retention
from sessionlog.records import SessionRecord, parse_filter
from sessionlog.retention import EXPIRED, IDLE, NS, Policy, due, expire_at, parse_duration
from sessionlog.storage import schema

NOW = 1_800_000_000 * NS


def test_due_by_expiry_idle_and_never_when_pinned() -> None:
    """An expiry at or before now is EXPIRED; an update older than the idle policy is IDLE;
    a pin keeps both; no expiry and no policy keep forever."""
    policy = Policy(idle_ns=60 * NS)

    def at(expire: int, pinned: bool, update: int, rule: Policy = policy) -> str | None:
        return due(
            expire_time_ns=expire, pinned=pinned, update_time_ns=update, now_ns=NOW, policy=rule
        )

    assert at(NOW, False, NOW) == EXPIRED
    assert at(NOW + 1, False, NOW) is None
    assert at(0, False, NOW - 60 * NS) == IDLE
    assert at(0, False, NOW - 59 * NS) is None
    assert at(NOW - 1, True, 0) is None
    assert at(0, False, 0, Policy()) is None


def test_expire_at_takes_a_ttl_or_a_future_time_within_the_cap() -> None:
    """A ttl counts from now; an absolute time is kept; none is 0 (never)."""
    assert expire_at(NOW, ttl_ns=5 * NS) == NOW + 5 * NS
    assert expire_at(NOW, expire_time_ns=NOW + 7) == NOW + 7
    assert expire_at(NOW) == 0
    assert expire_at(NOW, ttl_ns=retention.MAX_AHEAD_NS) == NOW + retention.MAX_AHEAD_NS


@pytest.mark.parametrize(
    ("ask", "field"),
    [
        ({"ttl_ns": 0}, "ttl"),
        ({"ttl_ns": -NS}, "ttl"),
        ({"ttl_ns": retention.MAX_AHEAD_NS + 1}, "ttl"),
        ({"expire_time_ns": NOW}, "expire_time"),
        ({"expire_time_ns": NOW - NS}, "expire_time"),
        ({"expire_time_ns": NOW + retention.MAX_AHEAD_NS + 1}, "expire_time"),
    ],
)
def test_bad_expiries_are_invalid_expiration(ask: dict[str, int], field: str) -> None:
    """Zero, negative or too long a ttl, and a past or too distant time, name their field."""
    with pytest.raises(errors.InvalidExpiration) as raised:
        expire_at(NOW, **ask)
    assert raised.value.metadata["field"] == field


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("90s", 90 * NS),
        ("30m", 1800 * NS),
        ("12h", 43200 * NS),
        ("7d", 604800 * NS),
        ("2w", 1209600 * NS),
        ("1.5", 1_500_000_000),
        ("250ms", 250_000_000),
        (3, 3 * NS),
    ],
)
def test_durations(text: object, ns: int) -> None:
    """A number of seconds, or a number with a unit."""
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["", "7 days", "-5s", "h", True, float("nan")])
def test_bad_durations(text: object) -> None:
    """Anything else is a ValueError naming the value."""
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_the_mask_sets_retention_fields_only_when_named() -> None:
    """ "expire_time" and "pinned" change only when a path names them; "*" and an empty mask
    leave them; other fields stay."""
    current = SessionRecord(title="t", expire_time_ns=NOW, pinned=True)
    kept = records.apply_mask(current, "new", {}, "", "", ["*"], expire_time_ns=0, pinned=False)
    assert (kept.title, kept.expire_time_ns, kept.pinned) == ("new", NOW, True)
    kept = records.apply_mask(current, "x", {}, "", "", None)
    assert (kept.expire_time_ns, kept.pinned) == (NOW, True)
    changed = records.apply_mask(
        current, "", {}, "", "", ["expire_time", "pinned"], expire_time_ns=0, pinned=False
    )
    assert (changed.title, changed.expire_time_ns, changed.pinned) == ("t", 0, False)
    with pytest.raises(errors.InvalidUpdateMask):
        records.check_mask(["expiry"])


def test_filters_on_pinned_and_expire_time() -> None:
    """pinned = true/false and expire_time comparisons; a session without expiry matches no
    expire_time comparison."""
    pinned = SessionRecord(pinned=True)
    soon = SessionRecord(expire_time_ns=NOW)
    assert parse_filter("pinned = true").matches(pinned, "", 0)
    assert not parse_filter("pinned = true").matches(soon, "", 0)
    assert parse_filter("pinned = false").matches(None, "", 0)
    assert parse_filter("pinned != true").matches(soon, "", 0)
    later = parse_filter('expire_time < "2030-01-01T00:00:00Z"')
    assert later.matches(soon, "", 0)
    assert not later.matches(pinned, "", 0)
    assert not parse_filter('expire_time > "2030-01-01T00:00:00Z"').matches(soon, "", 0)
    for bad in ("pinned = yes", "pinned > true", 'expire_time = "2030-01-01T00:00:00Z"'):
        with pytest.raises(errors.InvalidFilter):
            parse_filter(bad)


def test_the_stored_record_keeps_expiry_and_pin() -> None:
    """encode/decode round-trips both; a record without them encodes as before."""
    record = SessionRecord(title="t", expire_time_ns=NOW, pinned=True, update_time_ns=5)
    assert schema.decode_record(schema.encode_record(record)) == record
    plain = SessionRecord(title="t")
    assert b"pinned" not in schema.encode_record(plain)
    assert b"expire" not in schema.encode_record(plain)
    assert not SessionRecord(pinned=True).empty()
    assert not SessionRecord(expire_time_ns=1).empty()
