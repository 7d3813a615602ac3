"""Bearer-token authentication and per-token authorization.

Tokens come from a TOML file the operator writes:

    [[token]]
    name = "tenant-a-worker"            # shown in logs and errors, never the secret
    sha256 = "9f86d08..."               # hex SHA-256 of the secret (or: token = "the secret")
    permissions = ["read", "write"]     # read, write, admin (admin implies read and write)
    session_prefix = "tenant-a."        # optional: only sessions whose id starts with this

A request carries ``authorization: Bearer <secret>``. Missing ("no token") or unknown ("token
not recognised", logged at WARNING with its length and a SHA-256 prefix, never itself) secrets are
UNAUTHENTICATED; a known token used outside its permissions or its session prefix is
PERMISSION_DENIED. Secrets are compared by their SHA-256 digests with ``hmac.compare_digest``
against every configured token, so the time taken says nothing about which one nearly matched.
Secrets are never logged.

AdminService (the store's stats, a copy of the whole store, every session's lease audit) needs
``admin``, and like the change feed it is refused to a token limited to a session prefix, but for
EraseSessions, which erases only under such a token's prefix (a tenant's admin erases its own).

Permissions per RPC: reads (Since, ListEvents, Surface, DeriveMessages, GetState, GetUsage,
GetSession, ListSessions, FollowSessions, GetShardMap) need ``read`` (FollowSessions and
ListSessions are narrowed to a token's session prefix); writes (Append, CreateSession, SeedSession,
ForkSession, UpdateSession, leases, DeleteSession, RedactEvents) need ``write``; a forced lease
release, a forced delete, EraseSessions and the change feed (which carries every tenant's data)
need ``admin``.
GetReplicationStatus needs ``read``. Calls whose answer spans every session (the change feed, and
the replication status with its global positions) are refused to any token limited to a session
prefix. Health and reflection need any valid token unless the operator opens them
(``--auth-open-health``).

A session prefix is matched byte for byte: "team-a" also admits "team-ab". Loading refuses a
prefix no valid session id can start with, and warns (one line per token) about a prefix that
does not end in a separator (``.``, ``-`` or ``_``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import tomllib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from sessionlog import errors, fold
from sessionlog.service.errors import to_grpc_status

log = logging.getLogger(__name__)

REFUSED_DIGEST_CHARS = 8
"""How much of a refused token's SHA-256 its log line shows."""

READ, WRITE, ADMIN = "read", "write", "admin"
PERMISSIONS = frozenset({READ, WRITE, ADMIN})

_NEEDS = {
    "/sessionlog.v1.SessionLogService/Append": WRITE,
    "/sessionlog.v1.SessionLogService/AppendStream": WRITE,
    "/sessionlog.v1.SessionLogService/Since": READ,
    "/sessionlog.v1.SessionLogService/ListEvents": READ,
    "/sessionlog.v1.SessionLogService/Surface": READ,
    "/sessionlog.v1.SessionLogService/DeriveMessages": READ,
    "/sessionlog.v1.SessionLogService/GetState": READ,
    "/sessionlog.v1.SessionLogService/GetUsage": READ,
    "/sessionlog.v1.SessionLogService/CreateSession": WRITE,
    "/sessionlog.v1.SessionLogService/SeedSession": WRITE,
    "/sessionlog.v1.SessionLogService/GetSession": READ,
    "/sessionlog.v1.SessionLogService/ListSessions": READ,
    "/sessionlog.v1.SessionLogService/UpdateSession": WRITE,
    "/sessionlog.v1.SessionLogService/ForkSession": WRITE,
    "/sessionlog.v1.SessionLogService/AcquireLease": WRITE,
    "/sessionlog.v1.SessionLogService/RenewLease": WRITE,
    "/sessionlog.v1.SessionLogService/ReleaseLease": WRITE,
    "/sessionlog.v1.SessionLogService/GetShardMap": READ,
    "/sessionlog.v1.SessionLogService/ImportSession": WRITE,
    "/sessionlog.v1.SessionLogService/GetSessionRecords": ADMIN,
    "/sessionlog.v1.SessionLogService/DeleteSession": WRITE,
    "/sessionlog.v1.SessionLogService/RedactEvents": WRITE,
    "/sessionlog.v1.SessionLogService/FollowSessions": READ,
    "/sessionlog.v1.AdminService/GetStats": ADMIN,
    "/sessionlog.v1.AdminService/SaveSnapshot": ADMIN,
    "/sessionlog.v1.AdminService/Promote": ADMIN,
    "/sessionlog.v1.AdminService/Fence": ADMIN,
    "/sessionlog.v1.AdminService/ListLeaseAudit": ADMIN,
    "/sessionlog.v1.AdminService/EraseSessions": ADMIN,
    "/sessionlog.v1.ReplicationService/Changes": ADMIN,
    "/sessionlog.v1.ReplicationService/GetReplicationStatus": READ,
    "/sessionlog.v1.ReplicationService/ReportProgress": ADMIN,
}
_EVERY_SESSION = frozenset(
    {
        "/sessionlog.v1.AdminService/GetStats",
        "/sessionlog.v1.AdminService/SaveSnapshot",
        "/sessionlog.v1.AdminService/Promote",
        "/sessionlog.v1.AdminService/Fence",
        "/sessionlog.v1.AdminService/ListLeaseAudit",
        "/sessionlog.v1.ReplicationService/Changes",
        "/sessionlog.v1.ReplicationService/GetReplicationStatus",
        "/sessionlog.v1.ReplicationService/ReportProgress",
    }
)
"""Calls whose answer spans every session: refused to a token limited to a session prefix.
EraseSessions is not one: its handler narrows a tenant admin's erase to the token's prefix."""
PREFIX_SEPARATORS = ".-_"
"""Characters that may end a session prefix without it also admitting longer names."""
_OPENABLE_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


class AuthConfigError(ValueError):
    """The tokens file is unusable; the message names the entry and what is wrong."""


@dataclass(frozen=True)
class Principal:
    """Who a valid token says the caller is."""

    name: str
    permissions: frozenset[str]
    session_prefix: str = ""

    def may(self, permission: str) -> bool:
        return ADMIN in self.permissions or permission in self.permissions

    def listing_prefix(self, asked: str) -> str:
        """The prefix a listing really uses: the asked one, narrowed to this token's prefix;
        PERMISSION_DENIED when the two cannot overlap."""
        allowed = self.session_prefix
        if not allowed or asked.startswith(allowed):
            return asked
        if allowed.startswith(asked):
            return allowed
        self.check_session(asked)
        return asked

    def admits(self, session_id: str) -> bool:
        """Whether this token may touch ``session_id`` (``check_session`` without the error)."""
        return not self.session_prefix or session_id.startswith(self.session_prefix)

    def check_session(self, session_id: str) -> None:
        """Refuse a session outside this token's prefix (PERMISSION_DENIED, id not echoed)."""
        if self.session_prefix and not session_id.startswith(self.session_prefix):
            raise errors.PermissionDenied(
                f"token '{self.name}' may only use sessions whose id starts with "
                f"'{self.session_prefix}'",
                token=self.name,
                session_prefix=self.session_prefix,
            )


@dataclass(frozen=True)
class _Entry:
    digest: bytes
    principal: Principal


class TokenTable:
    """The configured tokens, by the SHA-256 digest of their secret."""

    def __init__(self, entries: Iterable[_Entry]) -> None:
        self._entries = tuple(entries)

    @classmethod
    def load(cls, path: str | Path, warn: bool = True) -> TokenTable:
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeError) as exc:
            raise AuthConfigError(f"cannot read tokens file {str(path)!r}: {exc}") from None
        return cls.parse(text, str(path), warn)

    @classmethod
    def parse(cls, text: str, source: str = "<tokens>", warn: bool = True) -> TokenTable:
        """The table a tokens file's text describes; AuthConfigError naming the entry at fault.
        Unless not ``warn``, warns once per token whose prefix admits longer names than it
        looks like it does."""
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise AuthConfigError(f"cannot read tokens file {source!r}: {exc}") from None
        tokens = document.get("token")
        if not isinstance(tokens, list) or not tokens:
            raise AuthConfigError(f"tokens file {source!r} has no [[token]] entries")
        entries = [_entry(i, item) for i, item in enumerate(tokens)]
        names: dict[bytes, str] = {}
        for entry in entries:
            # One secret in two entries would silently get only one entry's rights.
            if entry.digest in names:
                raise AuthConfigError(
                    f"tokens {names[entry.digest]!r} and {entry.principal.name!r} have the same "
                    "secret; give each token its own"
                )
            names[entry.digest] = entry.principal.name
        for entry in entries if warn else ():
            _warn_open_ended(entry.principal)
        return cls(entries)

    def principal(self, secret: str) -> Principal | None:
        """The principal of a presented secret, or None; constant time over all entries.

        Any text is accepted: a header that was not UTF-8 reaches here with surrogate escapes,
        which ``surrogatepass`` encodes to bytes no configured token (valid text) encodes to.
        """
        presented = hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()
        found: Principal | None = None
        for entry in self._entries:
            if hmac.compare_digest(presented, entry.digest):
                found = entry.principal
        return found

    def __len__(self) -> int:
        return len(self._entries)


def _entry(index: int, item: Any) -> _Entry:
    where = f"[[token]] #{index + 1}"
    if not isinstance(item, dict):
        raise AuthConfigError(f"{where} is not a table")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise AuthConfigError(f"{where} needs a name")
    if ("token" in item) == ("sha256" in item):
        raise AuthConfigError(f"{where} ({name}) needs exactly one of token or sha256")
    if "token" in item:
        if not isinstance(item["token"], str) or len(item["token"]) < 16:
            raise AuthConfigError(f"{where} ({name}): token must be a string of 16+ characters")
        digest = hashlib.sha256(item["token"].encode()).digest()
    else:
        try:
            digest = bytes.fromhex(str(item["sha256"]))
        except ValueError:
            digest = b""
        if len(digest) != 32:
            raise AuthConfigError(f"{where} ({name}): sha256 must be 64 hex digits")
    permissions = item.get("permissions", [READ])
    if not isinstance(permissions, list) or not all(
        isinstance(p, str) and p in PERMISSIONS for p in permissions
    ):
        raise AuthConfigError(f"{where} ({name}): permissions must be a list of read/write/admin")
    if not permissions:
        raise AuthConfigError(
            f"{where} ({name}): permissions is empty, so the token could call nothing; list at "
            "least one of read, write, admin (or delete the token)"
        )
    return _Entry(digest, Principal(name, frozenset(permissions), _prefix(where, name, item)))


def _prefix(where: str, name: str, item: dict[str, Any]) -> str:
    """The entry's session prefix: empty, or text some valid session id starts with.

    A non-empty prefix of a valid id is itself a valid id (the rules are per character, plus a
    length cap), so checking the prefix as an id decides whether any id can match it."""
    prefix = item.get("session_prefix", "")
    if not isinstance(prefix, str):
        raise AuthConfigError(f"{where} ({name}): session_prefix must be a string")
    if prefix:
        try:
            fold.check_session_id(prefix)
        except errors.InvalidSessionId as exc:
            raise AuthConfigError(
                f"{where} ({name}): session_prefix {prefix!r} can match no session id ({exc}); "
                "fix the prefix"
            ) from None
    return prefix


def _warn_open_ended(principal: Principal) -> None:
    prefix = principal.session_prefix
    if prefix and prefix[-1] not in PREFIX_SEPARATORS:
        log.warning(
            "a token's session_prefix does not end in '.', '-' or '_', so it also admits every "
            "longer id that starts with it ('team-a' admits 'team-ab'); end it with a separator "
            "unless that is meant",
            extra={"token": principal.name, "session_prefix": prefix},
        )


def bearer(metadata: Iterable[tuple[str, Any]] | None) -> str:
    """The secret of an ``authorization: Bearer <secret>`` header ("" if none); the scheme is
    case-insensitive (RFC 7235)."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, secret = value.partition(" ")
            if scheme.lower() == "bearer":
                return secret.strip()
    return ""


class Authorizer:
    """Decides, per call, whether it may go on; used by the interceptor and the handlers."""

    def __init__(self, tokens: TokenTable, open_health: bool = False) -> None:
        self.tokens = tokens
        self.open_health = open_health

    def check(self, method: str, metadata: Iterable[tuple[str, Any]] | None) -> Principal | None:
        """The caller's principal if the method is allowed; raises otherwise. None: open call."""
        if self.open_health and method.startswith(_OPENABLE_PREFIXES):
            return None
        secret = bearer(metadata)
        if not secret:
            raise errors.Unauthenticated(
                "no token: send the metadata 'authorization: Bearer <token>'"
            )
        principal = self.tokens.principal(secret)
        if principal is None:
            # The secret is never logged: its length and the start of its SHA-256 (the digest
            # the token file holds) are enough to tell which client sends it.
            digest = hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()[
                :REFUSED_DIGEST_CHARS
            ]
            log.warning(
                "refused a token not recognised on %s (%d characters, sha256 %s...)",
                method,
                len(secret),
                digest,
            )
            raise errors.Unauthenticated(
                "token not recognised: the 'authorization: Bearer' token sent is not one of this "
                "server's tokens"
            )
        needed = _NEEDS.get(method, READ)
        if not principal.may(needed):
            raise errors.PermissionDenied(
                f"token '{principal.name}' lacks the {needed} permission this call needs",
                token=principal.name,
                permission=needed,
            )
        if principal.session_prefix and method in _EVERY_SESSION:
            raise errors.PermissionDenied(
                f"token '{principal.name}' is limited to sessions starting with "
                f"'{principal.session_prefix}', and this call's answer spans every session",
                token=principal.name,
                session_prefix=principal.session_prefix,
            )
        return principal


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls without a valid token or the right permission before they reach a handler."""

    def __init__(self, authorizer: Authorizer) -> None:
        self._authorizer = authorizer

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        try:
            self._authorizer.check(details.method, details.invocation_metadata)
        except errors.SessionLogError as error:
            return _refusal(handler, error)
        return handler


def _refusal(handler: grpc.RpcMethodHandler | None, error: errors.SessionLogError) -> Any:
    status = to_grpc_status(error)

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(status.code, status.details, status.trailing_metadata)

    if handler is not None and handler.response_streaming:
        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        return grpc.unary_stream_rpc_method_handler(refuse)
    if handler is not None and handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
