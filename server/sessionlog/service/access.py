"""Who may do what, for the gRPC services: the caller's principal (its bearer token), its
session prefix, and the admin permission some calls need. Each check raises its refusal
(PermissionDenied, or the token's scope) or returns; with no authorizer (auth off) all pass."""

from __future__ import annotations

import grpc

from sessionlog import errors
from sessionlog.service.auth import ADMIN, Authorizer, Principal, bearer


def require_admin(
    authorizer: Authorizer | None, context: grpc.aio.ServicerContext, what: str
) -> None:
    principal = principal_of(authorizer, context)
    if principal is not None and not principal.may(ADMIN):
        raise errors.PermissionDenied(
            f"token '{principal.name}' lacks the admin permission {what} needs",
            token=principal.name,
            permission=ADMIN,
        )


def principal_of(
    authorizer: Authorizer | None, context: grpc.aio.ServicerContext
) -> Principal | None:
    if authorizer is None:
        return None
    return authorizer.tokens.principal(bearer(context.invocation_metadata()))


def scope(
    authorizer: Authorizer | None,
    context: grpc.aio.ServicerContext,
    *session_ids: str,
    admin: bool = False,
) -> None:
    """Refuse sessions outside the caller's token prefix (and, with admin, a non-admin)."""
    principal = principal_of(authorizer, context)
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


def listing_prefix(
    authorizer: Authorizer | None, context: grpc.aio.ServicerContext, asked: str
) -> str:
    """The prefix a listing really uses: the caller's, narrowed to their token's prefix."""
    principal = principal_of(authorizer, context)
    return asked if principal is None else principal.listing_prefix(asked)


def actor(authorizer: Authorizer | None, context: grpc.aio.ServicerContext) -> str:
    """Who asks, for an erasure's audit record: the token's name when auth is on."""
    principal = principal_of(authorizer, context)
    return "" if principal is None else principal.name


def refuse_every_session(principal: Principal, what: str) -> None:
    """PERMISSION_DENIED: ``what`` spans every session, and the token is limited to a prefix."""
    raise errors.PermissionDenied(
        f"token '{principal.name}' is limited to sessions starting with "
        f"'{principal.session_prefix}', and {what} spans every session",
        token=principal.name,
        session_prefix=principal.session_prefix,
    )
