"""The pure side of session records: the ListSessions filter parser and matcher, the label
rules, and UpdateSession's field mask (``sessionlog.records``)."""

from __future__ import annotations

import pytest

from sessionlog import errors
from sessionlog.records import (
    Filter,
    SessionRecord,
    Term,
    apply_mask,
    check,
    check_mask,
    parse_filter,
)

T0 = 1_767_366_245_000_000_000  # 2026-01-02T15:04:05Z


# -- parsing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ("", ()),
        ("   ", ()),
        ('labels.team = "core"', (Term("labels", "=", key="team", value="core"),)),
        ("labels.team=core", (Term("labels", "=", key="team", value="core"),)),
        ("labels.example.com/tier:*", (Term("labels", ":*", key="example.com/tier"),)),
        ('labels.a != "b"', (Term("labels", "!=", key="a", value="b"),)),
        ('owner = "ana b"', (Term("owner", "=", value="ana b"),)),
        (
            'status = "done" AND parent = p1',
            (Term("status", "=", value="done"), Term("parent", "=", value="p1")),
        ),
        (
            'update_time >= "2026-01-02T15:04:05Z"',
            (Term("update_time", ">=", value="2026-01-02T15:04:05Z", time_ns=T0),),
        ),
        (
            'update_time < "2026-01-02T17:04:05+02:00"',
            (Term("update_time", "<", value="2026-01-02T17:04:05+02:00", time_ns=T0),),
        ),
        ('owner = "say \\"hi\\""', (Term("owner", "=", value='say "hi"'),)),
    ],
)
def test_parses_the_subset(text: str, terms: tuple[Term, ...]) -> None:
    """Every supported form, with quoted and bare values and AND."""
    assert parse_filter(text) == Filter(terms)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("labels.team", "expected an operator"),
        ('owner = "a" OR owner = "b"', "only AND"),
        ('owner = "a" status = "b"', "expected AND"),
        ("OR owner = a", "only AND"),
        ("(owner = a)", "only AND"),
        ("colour = red", "unknown field 'colour'"),
        ("labels = x", "name the label"),
        ('labels.k:"v"', "takes * only"),
        ("labels.k > v", "labels.k compares"),
        ("owner > a", "owner compares"),
        ("owner.x = a", "not filterable"),
        ('update_time = "2026-01-02T15:04:05Z"', "update_time compares"),
        ('update_time > "2026-01-02T15:04:05"', "RFC 3339"),
        ('update_time > "soon"', "RFC 3339"),
        ("owner = a AND", "expected a term"),
        ('owner = "\\q"', "bad escape"),
        ("x" * 5000, "at most"),
    ],
)
def test_refuses_what_it_cannot_parse(text: str, says: str) -> None:
    """A filter outside the subset is InvalidFilter, and the message says what is wrong."""
    with pytest.raises(errors.InvalidFilter) as caught:
        parse_filter(text)
    assert says in caught.value.message


# -- matching -----------------------------------------------------------------------------------


def test_matches_each_term_and_all_terms() -> None:
    """A session matches when every term holds; a session without a record has no labels."""
    record = SessionRecord(labels={"team": "core"}, owner="ana", status="done")
    both = parse_filter('labels.team = core AND owner = "ana"')
    assert both.matches(record, "", T0)
    assert not both.matches(SessionRecord(labels={"team": "core"}, owner="bob"), "", T0)
    assert not both.matches(None, "", T0)
    assert parse_filter("labels.team != web").matches(None, "", T0)
    assert parse_filter("labels.team:*").matches(record, "", T0)
    assert not parse_filter("labels.env:*").matches(record, "", T0)
    assert parse_filter("parent = p").matches(None, "p", T0)
    assert not parse_filter("parent = p").matches(None, "", T0)
    after = parse_filter('update_time > "2026-01-02T15:04:05Z"')
    assert after.matches(None, "", T0 + 1)
    assert not after.matches(None, "", T0)
    assert after.updated_after() == T0
    assert parse_filter("owner = a").updated_after() is None


# -- rules and masks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        SessionRecord(labels={"": "x"}),
        SessionRecord(labels={"-a": "x"}),
        SessionRecord(labels={"a" * 64: "x"}),
        SessionRecord(labels={"Bad_Prefix/a": "x"}),
        SessionRecord(labels={"a": "b c"}),
        SessionRecord(labels={f"k{i}": "v" for i in range(65)}),
        SessionRecord(status="two words"),
        SessionRecord(title="x" * 1025),
        SessionRecord(title="tab\there"),
        SessionRecord(owner="o" * 257),
    ],
)
def test_refuses_values_outside_their_rules(record: SessionRecord) -> None:
    with pytest.raises(errors.InvalidSessionField):
        check(record)


def test_accepts_kubernetes_style_labels() -> None:
    check(
        SessionRecord(
            title="Plan the trip ✈",
            labels={"app.kubernetes.io/name": "agent", "tier": "", "a": "A-1_b.2"},
            owner="ana@example.com",
            status="waiting_for_user",
        )
    )


def test_mask_paths() -> None:
    """Settable paths pass; output-only and unknown ones are InvalidUpdateMask."""
    check_mask(["title", "labels", "labels.x", "owner", "status", "*"])
    for path in ("event_count", "session_id", "parent_seq", "nope", "labels_x"):
        with pytest.raises(errors.InvalidUpdateMask):
            check_mask([path])


def test_apply_mask_keeps_what_it_does_not_name() -> None:
    current = SessionRecord(title="t", labels={"a": "1", "b": "2"}, owner="o", parent_seq=3)
    out = apply_mask(current, "T", {"b": "9"}, "", "s", ["title", "labels.b", "labels.a"])
    assert out == SessionRecord(title="T", labels={"b": "9"}, owner="o", parent_seq=3)
    assert current.labels == {"a": "1", "b": "2"}  # the current record is not changed
    filled = apply_mask(current, "", {}, "", "s", None)
    assert (filled.title, filled.status) == ("t", "s")
    cleared = apply_mask(current, "", {}, "", "", ["*"])
    assert cleared.empty() is False
    assert (cleared.title, cleared.labels) == ("", {})
