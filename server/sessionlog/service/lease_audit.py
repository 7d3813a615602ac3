"""ListLeaseAudit: the lease audit of every session (or of a prefix), paged, for an operator.

The audit database is keyed by session id + 0x00 + record number (``storage.schema``), so the
whole audit is one ordered key range and a page is a cursor walk from the last key returned.
A page token names that key, bound to the prefix it was listed under, exactly like
ListSessions' tokens (``listing.encode_page_token``): base64url without padding of one version
byte, the first 8 bytes of the prefix's SHA-256, the record number (u64 BE), then the session
id's UTF-8, in the frame of every listing's tokens (``listing.seal``). Fixed offsets, so
decoding needs no general parser. Anything else is INVALID_PAGE_TOKEN naming the field, as a
bad token of any other listing is.

A sharded server lists only the sessions its group owns now (a moved slot's audit stays
behind on its old owner, which no longer lists it).
"""

from __future__ import annotations

import struct

from sessionlog import fold, listing
from sessionlog.service.convert import audit_message
from sessionlog.service.usecases import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from sessionlog.shard.ownership import Ownership
from sessionlog.storage.store import AuditEntry, Store
from sessionlog.v1 import admin_service_pb2 as apb

TOKEN_VERSION = 1
_INDEX = struct.Struct(">Q")
_HEAD = bytes((TOKEN_VERSION,))


def _digest(prefix: str) -> bytes:
    return listing.binding(b"lease-audit\x00", prefix.encode())


def encode_token(last: AuditEntry, prefix: str) -> str:
    """The token that continues a listing under ``prefix`` after ``last``."""
    body = _INDEX.pack(last.index) + last.session_id.encode()
    return listing.seal(_HEAD, _digest(prefix), body)


def decode_token(token: str, prefix: str) -> tuple[str, int] | None:
    """The (session id, record number) a token continues after; None for no token."""
    if not token:
        return None

    def read(body: bytes) -> tuple[str, int]:
        if len(body) <= _INDEX.size:
            raise ValueError("not a lease audit page token")
        index: int = _INDEX.unpack_from(body)[0]
        session_id = body[_INDEX.size :].decode("utf-8")
        fold.check_session_id(session_id)
        if not session_id.startswith(prefix):
            raise ValueError("names a session outside the prefix")
        return session_id, index

    return listing.unseal(
        token,
        _HEAD,
        _digest(prefix),
        read,
        longest=_INDEX.size + fold.MAX_SESSION_ID_BYTES,
        rpc="ListLeaseAudit",
        again="with the same prefix; list again from the start without one",
    )


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
