"""The filter grammar (``records.parse_filter``) as properties: any string either parses to
what it says or is refused with InvalidFilter naming a position, never another exception; a
value holding an operator character is read only when quoted."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sessionlog import errors, fold
from sessionlog.records import RESERVED, Filter, SessionRecord, Term, parse_filter

PROPERTY = settings(max_examples=400, deadline=None)
TIME = "2026-01-02T15:04:05Z"

# Pieces a filter is made of, and the near misses between them.
TOKENS = [
    *("labels.", "labels", "labels.team", "labels.example.com/tier", "owner", "status"),
    *("parent", "pinned", "update_time", "expire_time", "colour", "owner.x", "."),
    *("=", "==", "!=", "!", ">", ">=", "<", "<=", ":", ":*", "*", "===", "= ="),
    *("AND", "OR", "NOT", "and", "(", ")", "-"),
    *('"', "'", "\\", '""', '"core"', '"a b"', '"=ann"', '"\\q"', '"\\u00e9"', f'"{TIME}"'),
    *("core", "ann", "=ann", "true", "false", "ann*", "é", "x:y", TIME),
    *(" ", " ", " ", "  ", "\t", "\n", "\x00", "\u2028"),
]


def plain_word(value: str) -> bool:
    """What the grammar calls a word, said independently of the parser's regexes."""
    return (
        bool(value)
        and value not in ("AND", "OR", "NOT")
        and not any(c.isspace() or c < " " or c == "\x7f" or c in RESERVED for c in value)
    )


LOOKALIKE_QUOTES = "\u201c\u201d\u201e\u2018\u2019\u201a\u00ab\u00bb\u2039\u203a\uff02\uff07`\u00b4"
RULED = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def holdable(field: str, value: str) -> bool:
    """Whether some session can hold ``value`` in ``field`` (the record's own rules)."""
    if field.startswith("labels.") or field == "status":
        return value == "" or RULED.fullmatch(value) is not None
    if field == "parent":
        try:
            fold.check_session_id(value)
        except errors.InvalidSessionId:
            return value == ""
        return True
    return len(value.encode("utf-8", "surrogatepass")) <= 256 and not any(
        c < " " or c == "\x7f" for c in value
    )


def refused(text: str) -> errors.InvalidFilter:
    with pytest.raises(errors.InvalidFilter) as caught:
        parse_filter(text)
    position = int(caught.value.metadata["position"])
    assert 1 <= position <= len(text) + 1
    assert f"at character {position}:" in caught.value.message
    return caught.value


def check_parses_or_refuses(text: str) -> None:
    try:
        parsed = parse_filter(text)
    except errors.InvalidFilter:
        refused(text)  # the refusal names a position inside the text
        return
    assert parse_filter(parsed.render()) == parsed  # the canonical spelling means the same
    if '"' not in text:  # nothing was quoted: every value is a plain word
        for term in parsed.terms:
            assert term.op == ":*" or plain_word(term.value), (text, term)


@PROPERTY
@given(st.lists(st.sampled_from(TOKENS), max_size=12).map("".join))
def test_filters_made_of_grammar_pieces_parse_or_are_refused(text: str) -> None:
    """Strings made of the grammar's tokens and their near misses: a Filter that reads back
    the same from its canonical spelling, or InvalidFilter with a position."""
    check_parses_or_refuses(text)


@PROPERTY
@given(st.text(max_size=60))
def test_any_string_parses_or_is_refused(text: str) -> None:
    """Any text at all: never an exception other than InvalidFilter."""
    check_parses_or_refuses(text)


FIELD_OPS = [
    ("owner", "="),
    ("owner", "!="),
    ("status", "="),
    ("parent", "!="),
    ("labels.team", "="),
    ("labels.example.com/tier", "!="),
]


@PROPERTY
@given(st.sampled_from(FIELD_OPS), st.text(max_size=20))
def test_a_quoted_value_is_read_exactly(field_op: tuple[str, str], value: str) -> None:
    """Any value a session can hold, double-quoted (JSON), is read as itself, and the term
    matches a session holding exactly it; one no session can hold is refused at the value."""
    field, op = field_op
    text = f"{field} {op} {json.dumps(value)}"
    if not holdable(field, value):
        assert refused(text).metadata["position"] == str(len(f"{field} {op} ") + 1)
        return
    parsed = parse_filter(text)
    name, _, key = field.partition(".")
    assert parsed == Filter((Term(name, op, key=key, value=value),))
    for held, equal in ((value, True), (value + "x", False)):
        record = SessionRecord(labels={key: held} if key else {}, owner=held, status=held)
        assert parsed.matches(record, held, 0) == (equal == (op == "="))


@PROPERTY
@given(st.sampled_from(FIELD_OPS), st.text(max_size=20))
def test_a_bare_value_is_read_only_when_it_is_a_plain_word(
    field_op: tuple[str, str], value: str
) -> None:
    """Unquoted, a value parses only when it is one plain word (no whitespace, no operator,
    quote, parenthesis, '*' or backslash, no keyword, not in typographic quotes) that a
    session can hold, and then it is read as itself."""
    field, op = field_op
    prefix = f"{field} {op} "
    text = prefix + value
    name, _, key = field.partition(".")
    word = value.strip()  # whitespace around a token is the grammar's, not the value's
    assume(not word.startswith('"'))  # that is a quoted value
    quoted = bool(word) and (word[0] in LOOKALIKE_QUOTES or word[-1] in LOOKALIKE_QUOTES)
    if plain_word(word) and not quoted and holdable(field, word):
        assert parse_filter(text) == Filter((Term(name, op, key=key, value=word),))
        return
    error = refused(text)
    if not word:
        return
    first = next((i for i, c in enumerate(word) if not plain_word(c)), None)
    if first is not None and word[first] in RESERVED:  # refused where the stray character stands
        start = len(prefix) + value.index(word)
        assert error.metadata["position"] == str(start + first + 1)


@pytest.mark.parametrize(
    ("text", "position", "says"),
    [
        ("owner ==ann", 8, "expected a value after 'owner ='"),
        ("labels.team ==", 14, "expected a value after 'labels.team ='"),
        ("owner = =ann", 9, "expected a value"),
        ("owner === ann", 8, "expected a value"),
        ("owner = = ann", 9, "expected a value"),
        ("owner !ann", 7, "expected an operator"),
        ("owner ! = ann", 7, "expected an operator"),
        ("owner =", 8, "found the end"),
        ("owner = ann AND", 16, "expected a term after AND"),
        ("owner = ann AND ", 17, "expected a term after AND"),
        ("owner = ann AND AND status = x", 17, "expected a term"),
        ("labels. = x", 8, "name the label after 'labels.'"),
        ("labels.:*", 8, "name the label"),
        ("labels = x", 7, "name the label"),
        ("labels.-x = y", 8, "label key '-x' is not valid"),
        ('owner = "ann', 9, "no closing double quote"),
        ('owner = ann"', 12, "unexpected"),
        ('owner = "a""b"', 12, "unexpected"),
        ('owner = "a"AND status = b', 12, "unexpected"),
        ("owner = 'ann'", 9, "double quotes"),
        ("owner = ann*", 12, "double quotes"),
        ("owner = a=b", 10, "double quotes"),
        ("owner = AND", 9, "keyword"),
        ("labels.k:*x", 11, "unexpected"),
        ('labels.k:"*"', 10, "takes * only"),
        (f"update_time > {TIME}", 28, "double quotes"),
        ("owner = a and status = b", 11, "expected AND"),
        ("owner = a AND(status = b)", 14, "whitespace after AND"),
        ("NOT owner = a", 1, "only AND"),
        ("pinned = yes", 10, "true or false"),
        ('update_time > "soon"', 15, "RFC 3339"),
        ("colour = red", 1, "unknown field"),
    ],
)
def test_malformed_filters_are_refused_at_their_position(
    text: str, position: int, says: str
) -> None:
    """Each malformed filter is InvalidFilter naming the character where it goes wrong."""
    error = refused(text)
    assert error.metadata["position"] == str(position)
    assert says in error.message


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("owner=ann", 'owner = "ann"'),
        (
            "  labels.team = core   AND\tstatus != done ",
            'labels.team = "core" AND status != "done"',
        ),
        ("labels.example.com/tier : *", "labels.example.com/tier:*"),
        ('owner = "=ann"', 'owner = "=ann"'),
        ('owner = ""', 'owner = ""'),
        ('owner = "AND"', 'owner = "AND"'),
        ("parent = rec-main.1_é", 'parent = "rec-main.1_é"'),
        ('pinned = "true"', 'pinned = "true"'),
        (f'expire_time <= "{TIME}"', f'expire_time <= "{TIME}"'),
    ],
)
def test_well_formed_filters_render_canonically(text: str, canonical: str) -> None:
    """Well-formed spellings, spaced or not, quoted or bare, read as their canonical form."""
    parsed = parse_filter(text)
    assert parsed.render() == canonical
    assert parse_filter(canonical) == parsed


@PROPERTY
@given(
    st.sampled_from(["update_time >", "expire_time <=", "pinned ="]),
    st.one_of(
        st.text(max_size=30),
        st.builds(
            lambda stamp, tail: stamp.isoformat() + tail,
            st.datetimes(),
            st.sampled_from(["", "Z", "+02:00", "-00:30", "z", " Z", "+2400"]),
        ),
    ),
)
def test_any_quoted_time_or_flag_parses_or_is_refused(field_op: str, value: str) -> None:
    """Times and flags go through their own checks (RFC 3339, true or false): any quoted value
    parses or is InvalidFilter at the value's position."""
    text = f"{field_op} {json.dumps(value)}"
    try:
        parsed = parse_filter(text)
    except errors.InvalidFilter:
        assert refused(text).metadata["position"] == str(len(field_op) + 2)
        return
    assert parse_filter(parsed.render()) == parsed
    assert parsed.terms[0].value == value
