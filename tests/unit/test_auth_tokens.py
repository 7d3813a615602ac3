"""Parsing a tokens file: entries that could never work are refused, risky prefixes are warned of.

No disk: ``TokenTable.parse`` takes the file's text.
"""

from __future__ import annotations

import logging

import pytest

from sessionlog.service.auth import AuthConfigError, TokenTable

SECRET = "0123456789abcdef0123"


def entry(name: str = "t", permissions: str = '["read"]', prefix: str | None = None) -> str:
    text = f'[[token]]\nname = "{name}"\ntoken = "{SECRET}{name}"\npermissions = {permissions}\n'
    return text + (f'session_prefix = "{prefix}"\n' if prefix is not None else "")


def test_empty_permissions_are_refused_naming_the_token() -> None:
    """`permissions = []` would make a token that can call nothing: refused, token named."""
    with pytest.raises(AuthConfigError, match=r"#2 \(idle\): permissions is empty"):
        TokenTable.parse(entry("ok") + entry("idle", permissions="[]"))


def test_absent_permissions_still_mean_read() -> None:
    """Leaving permissions out keeps its documented default: read."""
    table = TokenTable.parse(f'[[token]]\nname = "r"\ntoken = "{SECRET}"\n')
    principal = table.principal(SECRET)
    assert principal is not None
    assert principal.permissions == frozenset({"read"})


@pytest.mark.parametrize(
    ("prefix", "why"),
    [
        pytest.param("a b", "character 1", id="space"),
        pytest.param("-team.", "start with a letter", id="dash-first"),
        pytest.param(".team", "start with a letter", id="dot-first"),
        pytest.param("team/a.", "character 4", id="slash"),
        pytest.param("t" * 236, "235 bytes", id="too-long"),
        pytest.param("é" * 118, "235 bytes", id="too-long-in-bytes"),
    ],
)
def test_a_prefix_no_session_id_can_start_with_is_refused(prefix: str, why: str) -> None:
    """A prefix that no valid session id (SPEC §7) can start with would lock its token out of
    everything: refused at load, naming the token and the rule broken."""
    with pytest.raises(AuthConfigError, match="can match no session id") as caught:
        TokenTable.parse(entry("tenant", prefix=prefix))
    assert "(tenant)" in str(caught.value)
    assert why in str(caught.value)


@pytest.mark.parametrize("prefix", ["team-a.", "team-a-", "team_a_", "_t.", "ü.", "7.", "t" * 235])
def test_prefixes_some_id_starts_with_are_accepted(prefix: str) -> None:
    """A prefix is accepted when a valid id can start with it, up to the 235-byte limit."""
    table = TokenTable.parse(entry("tenant", prefix=prefix))
    principal = table.principal(SECRET + "tenant")
    assert principal is not None
    assert principal.session_prefix == prefix


def test_a_prefix_without_a_separator_warns_once_per_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """ "team-a" also admits "team-ab": one warning per such token, none for "team-b." or no
    prefix; the token still loads and works."""
    text = entry("loose", prefix="team-a") + entry("tight", prefix="team-b.") + entry("all")
    with caplog.at_level(logging.WARNING, logger="sessionlog.service.auth"):
        table = TokenTable.parse(text)
    assert [(r.token, r.session_prefix) for r in caplog.records] == [("loose", "team-a")]  # type: ignore[attr-defined]
    assert "'team-a' admits 'team-ab'" in caplog.records[0].getMessage()
    loose = table.principal(SECRET + "loose")
    assert loose is not None
    loose.check_session("team-ab.x")  # what the warning warns of: admitted


def test_a_secret_that_is_not_valid_text_matches_nothing() -> None:
    """A presented secret carrying surrogate escapes (an HTTP header that was not UTF-8) is no
    token's secret, and asking for it raises nothing."""
    table = TokenTable.parse(entry("t"))
    assert table.principal(SECRET + "t\udcff") is None
    assert table.principal("\ud800") is None
    assert table.principal(SECRET + "t") is not None
