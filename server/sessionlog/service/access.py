"""Who may do what: the checks every use case (``service.usecases``) makes of its caller's
principal (the token it sent; None when auth is off, and then every check passes). Each raises
its refusal (PermissionDenied, or the token's scope) or returns. The front ends only find the
principal (``principal_of`` for a gRPC call, the console from its Authorization header)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sessionlog import errors
from sessionlog.service.auth import ADMIN, Authorizer, Principal, bearer


def principal_of(
    authorizer: Authorizer | None, metadata: Iterable[tuple[str, Any]] | None
) -> Principal | None:
    """The principal a call's metadata names (its bearer token); None with auth off. The
    interceptor has already refused a call whose token is missing or not recognised."""
    if authorizer is None:
        return None
    return authorizer.tokens.principal(bearer(metadata))


def require_admin(principal: Principal | None, what: str) -> None:
    if principal is not None and not principal.may(ADMIN):
        raise errors.PermissionDenied(
            f"token '{principal.name}' lacks the admin permission {what} needs",
            token=principal.name,
            permission=ADMIN,
        )


def scope(principal: Principal | None, *session_ids: str, admin: bool = False) -> None:
    """Refuse sessions outside the caller's token prefix (and, with admin, a non-admin)."""
    if principal is None:
        return
    if admin and not principal.may(ADMIN):
        raise errors.PermissionDenied(
            f"token '{principal.name}' lacks the admin permission a forced release needs",
            token=principal.name,
            permission=ADMIN,
        )
    for session_id in session_ids:
        principal.check_session(session_id)


def listing_prefix(principal: Principal | None, asked: str) -> str:
    """The prefix a listing really uses: the caller's, narrowed to their token's prefix."""
    return asked if principal is None else principal.listing_prefix(asked)


def actor(principal: Principal | None) -> str:
    """Who asks, for an erasure's audit record: the token's name when auth is on."""
    return "" if principal is None else principal.name


def refuse_every_session(principal: Principal, what: str) -> None:
    """PERMISSION_DENIED: ``what`` spans every session, and the token is limited to a prefix."""
    raise errors.PermissionDenied(
        f"token '{principal.name}' is limited to sessions starting with "
        f"'{principal.session_prefix}', and {what} spans every session",
        token=principal.name,
        session_prefix=principal.session_prefix,
    )


def under(principal: Principal | None) -> str:
    """The prefix every session the caller makes must start with ("" with auth off)."""
    return "" if principal is None else principal.session_prefix
