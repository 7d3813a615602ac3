"""ListLeaseAudit's page tokens: they round-trip, are bound to their prefix, and anything else
is INVALID_PAGE_TOKEN naming page_token."""

from __future__ import annotations

import pytest

from sessionlog import errors
from sessionlog.listing import encode_page_token
from sessionlog.service.lease_audit import decode_token, encode_token
from sessionlog.storage.schema import AuditRecord, audit_key, split_audit_key
from sessionlog.storage.store import AuditEntry

RECORD = AuditRecord("TAKEOVER", "new", "old", 3, 1)


def test_a_token_names_the_last_entry_and_round_trips() -> None:
    """The token carries the session id and record number of the last entry of its page."""
    for session_id, index, prefix in [("a", 0, ""), ("tenant.é-1", 2**64 - 1, "tenant.")]:
        token = encode_token(AuditEntry(session_id, index, RECORD), prefix)
        assert decode_token(token, prefix) == (session_id, index)
    assert decode_token("", "any") is None


@pytest.mark.parametrize(
    ("token", "prefix"),
    [
        (encode_token(AuditEntry("a.x", 1, RECORD), "a."), "b."),  # another prefix
        (encode_token(AuditEntry("a.x", 1, RECORD), "a."), ""),
        (encode_page_token("a.x", ""), ""),  # a ListSessions token
        ("not base64!", ""),
        ("AQ", ""),  # too short to hold anything
        ("x" * 1000, ""),
    ],
)
def test_anything_else_is_invalid_page_token(token: str, prefix: str) -> None:
    with pytest.raises(errors.InvalidPageToken) as caught:
        decode_token(token, prefix)
    assert caught.value.metadata["field"] == "page_token"


def test_audit_keys_split_back_into_session_and_number() -> None:
    """split_audit_key undoes audit_key; a key without the 0x00 separator is refused."""
    assert split_audit_key(audit_key("ab.c", 7)) == ("ab.c", 7)
    with pytest.raises(ValueError, match="not an audit key"):
        split_audit_key(b"ab" + bytes(8))
