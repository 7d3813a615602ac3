"""ListLeaseAudit: the lease audit of every session (or of a prefix), paged, for an operator.

The audit database is keyed by session id + 0x00 + record number (``storage.schema``), so the
whole audit is one ordered key range and a page is a cursor walk from the last key returned.
A page token names that key, bound to the prefix it was listed under, exactly like
ListSessions' tokens (``listing.encode_page_token``): base64url without padding of one version
byte, the first 8 bytes of the prefix's SHA-256, the record number (u64 BE), then the session
id's UTF-8. Fixed offsets, so decoding needs no general parser. Anything else is
MALFORMED_REQUEST naming the field, as a bad ListSessions token is.

A sharded server lists only the sessions its group owns now (a moved slot's audit stays
behind on its old owner, which no longer lists it).
"""

from __future__ import annotations

import base64
import hashlib
import struct

from sessionlog import errors, fold
from sessionlog.service.convert import audit_message
from sessionlog.service.usecases import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from sessionlog.shard.ownership import Ownership
from sessionlog.storage.store import AuditEntry, Store
from sessionlog.v1 import admin_service_pb2 as apb

TOKEN_VERSION = 1
_DIGEST_BYTES = 8
_INDEX = struct.Struct(">Q")
_HEAD = 1 + _DIGEST_BYTES + _INDEX.size
_MAX_TOKEN_CHARS = 4 * -(-(_HEAD + fold.MAX_SESSION_ID_BYTES) // 3)
"""No token this server hands out is longer: anything longer is refused before decoding."""


def _digest(prefix: str) -> bytes:
    return hashlib.sha256(b"lease-audit\x00" + prefix.encode()).digest()[:_DIGEST_BYTES]


def encode_token(last: AuditEntry, prefix: str) -> str:
    """The token that continues a listing under ``prefix`` after ``last``."""
    payload = bytes((TOKEN_VERSION,)) + _digest(prefix) + _INDEX.pack(last.index)
    payload += last.session_id.encode()
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


def decode_token(token: str, prefix: str) -> tuple[str, int] | None:
    """The (session id, record number) a token continues after; None for no token."""
    if not token:
        return None
    try:
        if len(token) > _MAX_TOKEN_CHARS:
            raise ValueError("longer than any page token")
        payload = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        if len(payload) <= _HEAD or payload[:1] != bytes((TOKEN_VERSION,)):
            raise ValueError("not a lease audit page token")
        if payload[1 : 1 + _DIGEST_BYTES] != _digest(prefix):
            raise ValueError("made for another prefix")
        index: int = _INDEX.unpack(payload[1 + _DIGEST_BYTES : _HEAD])[0]
        session_id = payload[_HEAD:].decode("utf-8")
        fold.check_session_id(session_id)
        if not session_id.startswith(prefix):
            raise ValueError("names a session outside the prefix")
    except (ValueError, errors.InvalidSessionId):
        raise errors.MalformedRequest(
            "page_token is not a token from a previous ListLeaseAudit call with the same "
            "prefix; list again from the start without one",
            field="page_token",
        ) from None
    return session_id, index


def list_lease_audit(
    store: Store, ownership: Ownership, request: apb.ListLeaseAuditRequest
) -> apb.ListLeaseAuditResponse:
    """One page of the audit under ``request.prefix``, after ``request.page_token``."""
    ownership.check()  # sharded: a map must be held, or no session is known to be ours
    after = decode_token(request.page_token, request.prefix)
    size = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    entries, more = store.lease_audit(after, request.prefix, size, keep=ownership.owns)
    return apb.ListLeaseAuditResponse(
        entries=[
            apb.SessionLeaseAuditEntry(
                session_id=entry.session_id, entry=audit_message(entry.record), index=entry.index
            )
            for entry in entries
        ],
        next_page_token=encode_token(entries[-1], request.prefix) if more and entries else "",
    )
