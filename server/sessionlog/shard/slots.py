"""Slots: which part of the cluster a session belongs to.

A session's slot is ``crc32(utf-8 bytes of its id) % SLOTS``: zlib's CRC-32 (the IEEE polynomial,
the one HAProxy's ``crc32`` converter, Go's ``hash/crc32.ChecksumIEEE`` and every zip tool
compute), so a client in any language and HAProxy (``req.hdr(x-session-id),crc32,mod(1024)``)
agree on it without asking anyone. The slot count is fixed for the life of a cluster: changing it
moves nearly every session, so it is a constant, not a setting.

Every client sends the session id of a call in the ``x-session-id`` header (SESSION_HEADER): a
proxy routes on it without parsing the protobuf body.
"""

from __future__ import annotations

import zlib

SLOTS = 1024
"""The number of slots, fixed (as Redis Cluster fixes 16,384)."""

SESSION_HEADER = "x-session-id"
"""The request header that carries a call's session id (lower case, as gRPC metadata is)."""


def slot_of(session_id: str) -> int:
    """The slot of ``session_id``: CRC-32 of its UTF-8 bytes, modulo SLOTS."""
    return zlib.crc32(session_id.encode("utf-8")) % SLOTS
