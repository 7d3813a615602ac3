"""SPEC §7: which session ids are valid, counted in UTF-8 bytes, and errors that never echo them."""

from __future__ import annotations

import unicodedata

import pytest

from sessionlog import errors
from sessionlog.fold import check_session_id

VALID = [
    "a",
    "Z",
    "7",
    "_",
    "session-1",
    "agent_42.run-7",
    "a.b.c",
    "_leading_underscore",
    "9lives",
    "a-",
    "a.",
    "été",
    "東京セッション",
    "Ωmega",
    "٣٤",  # Arabic-Indic digits: Unicode Nd
    "Ⅻ",  # Roman numeral twelve: Unicode Nl
    "a\u0301",  # a + combining acute accent: M* after the first character
    "क्षत्रिय",  # Devanagari with combining vowel signs and virama
]

INVALID = [
    "",
    " ",
    "a b",
    " a",
    "a/b",
    "/a",
    "a:b",
    "a\\b",
    "a@b",
    "a+b",
    "a😀",
    "😀",
    "a\n",
    "a\x00b",
    "a\tb",
    "a\u200bb",  # zero-width space (Cf)
    "-a",
    ".a",
    "\u0301a",  # a combining mark may not come first
    "a\ud800",  # lone surrogate
]


@pytest.mark.parametrize("session_id", VALID)
def test_valid_ids_are_accepted(session_id: str) -> None:
    """Letters, numbers and '_' first; then letters, numbers, marks, '_', '.', '-'."""
    check_session_id(session_id)


@pytest.mark.parametrize("session_id", INVALID)
def test_invalid_ids_are_rejected(session_id: str) -> None:
    """Empty ids, spaces, '/', ':', emoji, control characters and bad first characters fail."""
    with pytest.raises(errors.InvalidSessionId) as caught:
        check_session_id(session_id)
    assert caught.value.reason == "INVALID_SESSION_ID"


def test_235_ascii_bytes_is_the_limit() -> None:
    """235 one-byte characters pass; 236 fail."""
    check_session_id("a" * 235)
    with pytest.raises(errors.InvalidSessionId):
        check_session_id("a" * 236)


def test_length_is_counted_in_utf8_bytes() -> None:
    """Multi-byte characters count by their UTF-8 size, not as one each."""
    two_byte = "é" * 117 + "a"  # 235 bytes, 118 characters
    assert len(two_byte.encode()) == 235
    check_session_id(two_byte)
    too_long = "é" * 118  # 236 bytes, only 118 characters
    assert len(too_long.encode()) == 236
    with pytest.raises(errors.InvalidSessionId):
        check_session_id(too_long)
    three_byte = "東" * 79  # 237 bytes, 79 characters
    with pytest.raises(errors.InvalidSessionId):
        check_session_id(three_byte)
    check_session_id("東" * 78 + "a")  # 235 bytes


@pytest.mark.parametrize(
    "session_id",
    [
        "secret tenant/alpha",
        "customer:4711:chat",
        "private😀conversation",
        "-leading-dash-secret",
        "x" * 236,
        "ok-prefix\nhidden-suffix",
    ],
)
def test_error_never_echoes_the_id(session_id: str) -> None:
    """Neither the message nor the metadata of the error contains the offending id."""
    with pytest.raises(errors.InvalidSessionId) as caught:
        check_session_id(session_id)
    failure = caught.value
    assert session_id not in str(failure)
    assert session_id not in failure.message
    assert session_id not in repr(failure)
    for value in failure.metadata.values():
        assert session_id not in value


def test_invalid_character_message_counts_from_zero() -> None:
    """The refusal names the bad character's index, says it counts from 0, and shows it."""
    with pytest.raises(errors.InvalidSessionId) as refused:
        check_session_id("ab c")
    assert "character 2 (counting from 0) is ' '" in str(refused.value)
    assert refused.value.metadata["position"] == "2"


def _by_the_rule(session_id: str) -> bool:
    """SPEC §7 read character by character (Unicode categories), as the slow path does."""
    if not 1 <= len(session_id.encode("utf-8", "surrogatepass")) <= 235:
        return False
    first, rest = session_id[0], session_id[1:]
    if not (first == "_" or unicodedata.category(first)[0] in "LN"):
        return False
    return all(ch in "_.-" or unicodedata.category(ch)[0] in "LNM" for ch in rest)


def _accepted(session_id: str) -> bool:
    try:
        check_session_id(session_id)
    except errors.InvalidSessionId:
        return False
    return True


def test_ascii_ids_are_judged_as_the_character_rule_judges_them() -> None:
    """The one-match path for ASCII ids agrees with the Unicode walk on every pair of ASCII
    characters, alone and at the length limit."""
    ascii_chars = [chr(c) for c in range(128)]
    for a in ascii_chars:
        assert _accepted(a) == _by_the_rule(a), repr(a)
        for b in ascii_chars:
            pair = a + b
            assert _accepted(pair) == _by_the_rule(pair), repr(pair)
            long = "x" * 233 + pair
            assert _accepted(long) == _by_the_rule(long), repr(pair)
    assert _accepted("a" * 235)
    assert not _accepted("a" * 236)
