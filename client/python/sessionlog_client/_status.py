"""gRPC statuses -> the server's own exception classes.

The server sends every refusal as a status with one ``google.rpc.ErrorInfo`` detail (domain
``sessionlog``); the reason picks the class from :mod:`sessionlog_client.errors` (a generated copy
of the server's module) and the metadata comes along as ``error.metadata``. Statuses that carry no
ErrorInfo come from the transport (a refused connection, a deadline) and map by status code:

    SessionLogError                  (sessionlog_client.errors)
    ├── Unavailable                  UNAVAILABLE, with or without ErrorInfo
    ├── Unauthenticated              UNAUTHENTICATED, with or without ErrorInfo
    ├── PermissionDenied             PERMISSION_DENIED, with or without ErrorInfo
    ├── DataCorrupted                INTERNAL from this client's own failure to parse a reply
    │                                (a damaged stored event that a stream sent as stored)
    └── TransportError               any other status without ErrorInfo; ``.code`` is its code
        ├── DeadlineExceeded         DEADLINE_EXCEEDED
        └── Cancelled                CANCELLED

A reason this client does not know (a newer server) still gets the class of its status code
(``InvalidArgument`` for INVALID_ARGUMENT...) with ``.reason`` set to the reason sent. The original
``grpc.RpcError`` is always the exception's ``__cause__``.

A proxy in front of the servers (HAProxy) answers a call it has no server for with an HTTP
status, 502, 503 or 504, which gRPC turns into UNAVAILABLE (UNKNOWN for other statuses) with
the status in the details: ``proxy_status`` reads it, and ``Unavailable`` then says that the
proxy answered and its group has no primary (or no serving member) right now.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import grpc
from google.rpc import error_details_pb2, status_pb2

from sessionlog_client import errors

if TYPE_CHECKING:
    from sessionlog_client.v1 import session_log_service_pb2 as pb

STATUS_DETAILS_KEY = "grpc-status-details-bin"
PROXY_STATUSES = frozenset({502, 503, 504})
"""The HTTP statuses a proxy answers when it has no server for a call (bad gateway, no server
up, gateway timeout): no server saw the call."""
# grpcio (C core): "Received http2 header with status: 503"; grpc-js: "Received HTTP status
# code 503".
_HTTP_STATUS = re.compile(r"(?:header with status|HTTP status code):? *(\d{3})\b")
_LARGER_THAN_MAX = re.compile(
    r"(?:(CLIENT|SERVER): )?(Sent|Received) message larger than max \((\d+) vs\. (\d+)\)"
)
"""grpcio's refusal of an oversized message, naming the end that refused it."""
TRANSPORT_ENDS = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.CANCELLED,
    }
)
"""The codes with which the transport ends a call when no server error does (no ErrorInfo): a
dropped connection, an RST_STREAM (``Stream removed``: a proxy lost the member behind the
call, or a reloaded proxy's old process stopped; CANCELLED when the peer reset it with CANCEL),
a proxy's HTTP status. A stream this client closed itself never gets this far."""


class TransportError(errors.SessionLogError):
    """A failure with no sessionlog reason: the call did not get a domain answer."""

    reason: ClassVar[str] = "TRANSPORT"
    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN


class DeadlineExceeded(TransportError):
    """The call's deadline (``timeout``) passed before the server answered."""

    reason = "DEADLINE_EXCEEDED"
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(TransportError):
    """The call was cancelled (by this process, or the server went away in a way gRPC names so)."""

    reason = "CANCELLED"
    code = grpc.StatusCode.CANCELLED


_BY_CODE: dict[grpc.StatusCode, type[errors.SessionLogError]] = {
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.CANCELLED: Cancelled,
}
# The domain class of each status code, for reasons newer than this client.
_DOMAIN_BY_CODE: dict[grpc.StatusCode, type[errors.SessionLogError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.ALREADY_EXISTS: errors.SessionAlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
}


def error_info(trailers: Iterable[tuple[str, Any]] | None) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo detail in a call's trailing metadata, if the server sent one."""
    for key, value in trailers or ():
        if key != STATUS_DETAILS_KEY:
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info):
                return info
    return None


UNDECODABLE_REPLY = "Exception deserializing response!"
"""The details of the INTERNAL status gRPC Python gives a reply its stub could not parse."""


def to_error(error: grpc.RpcError) -> errors.SessionLogError:
    """The sessionlog exception for a failed call (sync or asyncio)."""
    code: grpc.StatusCode = error.code()
    message: str = error.details() or code.name
    info = error_info(error.trailing_metadata())
    proxied = proxy_status(error) if info is None else None
    if proxied is not None:
        return errors.Unavailable(
            f"a proxy answered HTTP {proxied} in place of a sessionlog server: the group it "
            f"routes this call to has no primary (or no serving member) right now; try again "
            f"once a failover has elected one ({message})"
        )
    if info is None:
        oversized = _oversized(code, message)
        if oversized is not None:
            return oversized
        if code == grpc.StatusCode.INTERNAL and message == UNDECODABLE_REPLY:
            return errors.DataCorrupted(
                "a reply from the server could not be decoded: a streamed read (Since, "
                "Follow) sends the events as they are stored, so a damaged record of this "
                "session reaches the client as bytes that are not an Event; run `sessionlog "
                f"admin verify` on the server's data folder ({message})"
            )
        cls = _BY_CODE.get(code)
        if cls is not None:
            return cls(message)
        transport = TransportError(message)
        transport.code = code
        transport.reason = code.name  # type: ignore[misc]
        return transport
    known = errors.BY_REASON.get(info.reason)
    if known is not None:
        return known(message, **dict(info.metadata))
    fallback = _DOMAIN_BY_CODE.get(code, errors.SessionLogError)(message, **dict(info.metadata))
    fallback.reason = info.reason  # type: ignore[misc]
    return fallback


def stream_error(
    code: int, message: str, reason: str, metadata: Mapping[str, str]
) -> errors.SessionLogError:
    """The sessionlog exception for one AppendStream request's error (``AppendStreamError``):
    the class ``to_error`` gives the same refusal of a unary Append."""
    known = errors.BY_REASON.get(reason)
    if known is not None:
        return known(message, **metadata)
    status = _CODE_BY_NUMBER.get(code, grpc.StatusCode.UNKNOWN)
    fallback = _DOMAIN_BY_CODE.get(status, errors.SessionLogError)(message, **metadata)
    fallback.reason = reason  # type: ignore[misc]
    return fallback


def reply_error(reply: pb.AppendStreamResponse) -> errors.SessionLogError | None:
    """An AppendStream reply's refusal as the exception a unary Append raises (None: it
    acknowledged its append)."""
    if not reply.HasField("error"):
        return None
    failed = reply.error
    return stream_error(failed.code, failed.message, failed.reason, failed.metadata)


class ReplyJudge(Protocol):
    """What judges an AppendStream reply by its stream's epoch (``_routing.StreamEpochs``)."""

    def judge(self, session_id: str, error: errors.SessionLogError | None) -> None: ...


def judged_reply_error(
    reply: pb.AppendStreamResponse, session_id: str, epochs: ReplyJudge | None
) -> errors.SessionLogError | None:
    """``reply_error``, then judged by ``epochs``: LeadershipLost in place of an
    acknowledgement from a deposed server (None: the append stands acknowledged)."""
    error = reply_error(reply)
    if epochs is not None:
        try:
            epochs.judge(session_id, error)
        except errors.SessionLogError as lost:
            error = lost
    return error


_CODE_BY_NUMBER = {status.value[0]: status for status in grpc.StatusCode}


def _oversized(code: grpc.StatusCode, message: str) -> errors.SessionLogError | None:
    """gRPC's own bare refusal of a message over a size limit, said with the setting to change:
    a request this client would not send or the server's transport would not read
    (RequestTooLarge), a reply this client would not read (ResponseTooLarge)."""
    found = _LARGER_THAN_MAX.search(message) if code == grpc.StatusCode.RESOURCE_EXHAUSTED else None
    if found is None:
        return None
    end, direction = found.group(1), found.group(2)
    size, limit = int(found.group(3)), int(found.group(4))
    meta = {"size": str(size), "limit": str(limit)}
    if direction == "Sent":
        return errors.RequestTooLarge(
            f"the request is {size} bytes, over this client's {limit}-byte message limit "
            f"(Client(max_message_bytes=...)); nothing was sent: split it into smaller calls "
            f"(the server's own limit is its --max-message-size) ({message})",
            **meta,
        )
    if end == "SERVER":
        return errors.RequestTooLarge(
            f"the request is {size} bytes, far over the server's message limit "
            f"(--max-message-size; its transport reads no request over {limit} bytes); "
            f"nothing was written: split it into smaller calls ({message})",
            **meta,
        )
    if end == "CLIENT":
        return errors.ResponseTooLarge(
            f"the reply is {size} bytes, over this client's {limit}-byte message limit: raise "
            f"Client(max_message_bytes=...) to the server's --max-message-size ({message})",
            **meta,
        )
    error = TransportError(
        f"a message of {size} bytes is over a {limit}-byte limit: either the request is over "
        f"the server's --max-message-size (nothing was written), or the reply is over this "
        f"client's Client(max_message_bytes=...) ({message})"
    )
    error.code = code
    error.reason = code.name  # type: ignore[misc]
    return error


def is_unavailable(error: grpc.RpcError) -> bool:
    """True for the one status a client retries: UNAVAILABLE (transport or server shutdown)."""
    return bool(error.code() == grpc.StatusCode.UNAVAILABLE)


def proxy_status(error: grpc.RpcError) -> int | None:
    """The HTTP status (502, 503 or 504) a proxy answered ``error`` with, or None: a status
    without ErrorInfo whose details name one (see the module docstring)."""
    found = _HTTP_STATUS.search(error.details() or "")
    if found is None or int(found.group(1)) not in PROXY_STATUSES:
        return None
    if error_info(error.trailing_metadata()) is not None:
        return None
    return int(found.group(1))


def transport_end(error: grpc.RpcError) -> bool:
    """A call ended by the transport or a proxy, not by a server's answer: nothing the server
    refused, so a read stream resumes from where it was (see ``TRANSPORT_ENDS``). A handler's
    crash (gRPC's "Exception calling application" / "Exception iterating responses") is the
    server's answer, not the transport's."""
    if error.code() not in TRANSPORT_ENDS or (error.details() or "").startswith("Exception "):
        return False
    return error_info(error.trailing_metadata()) is None
