"""The one table from sessionlog errors to gRPC status codes (SPEC §9).

Every error leaves the server as a status with exactly one ``google.rpc.ErrorInfo`` detail:
domain ``sessionlog``, the error's reason, its metadata.
"""

from __future__ import annotations

import logging

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from sessionlog import errors

log = logging.getLogger(__name__)

_CODES: dict[type[errors.SessionLogError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.SessionAlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.SessionNotFound: grpc.StatusCode.NOT_FOUND,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.SeqConflict: grpc.StatusCode.ABORTED,
    errors.SessionUidMismatch: grpc.StatusCode.ABORTED,
    errors.StorageFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.ResponseTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.RequestTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.TooManyStreams: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.TooManySnapshots: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.LeadershipLost: grpc.StatusCode.UNAVAILABLE,
    errors.NotPrimary: grpc.StatusCode.FAILED_PRECONDITION,
    errors.AlreadyPrimary: grpc.StatusCode.FAILED_PRECONDITION,
    errors.StaleEpoch: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ClusterManaged: grpc.StatusCode.FAILED_PRECONDITION,
    errors.WrongGroup: grpc.StatusCode.FAILED_PRECONDITION,
    errors.CrossGroupFork: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ImportSeqMismatch: grpc.StatusCode.FAILED_PRECONDITION,
    errors.ShardMapUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.SlotMoving: grpc.StatusCode.UNAVAILABLE,
    errors.DataCorrupted: grpc.StatusCode.DATA_LOSS,
}


def status_code(error: errors.SessionLogError) -> grpc.StatusCode:
    """The gRPC code of an error: the entry of its nearest class in the table."""
    for cls in type(error).__mro__:
        code = _CODES.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def refusal_level(error: errors.SessionLogError) -> int:
    """How loudly to log a refused call: damaged data is an operator's emergency, a full map or
    a shutdown needs their attention, anything else is the caller's business."""
    if isinstance(error, errors.DataCorrupted):
        return logging.ERROR
    if isinstance(error, errors.ReplicasUnavailable):
        return logging.INFO  # one warning per episode comes from ``cluster.sync``
    if isinstance(error, errors.StorageFull | errors.Unavailable):
        return logging.WARNING
    return logging.INFO


def to_grpc_status(error: errors.SessionLogError) -> grpc.Status:
    """The status (code, message, trailing ErrorInfo) a client receives for ``error``."""
    code = status_code(error)
    info = error_details_pb2.ErrorInfo(
        reason=error.reason, domain=errors.DOMAIN, metadata=error.metadata
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(
        code=getattr(code_pb2, code.name), message=error.message, details=[detail]
    )
    return rpc_status.to_status(status)


async def abort(
    context: grpc.aio.ServicerContext,
    error: errors.SessionLogError,
    trailing: tuple[tuple[str, str], ...] = (),
) -> None:
    """End the call with ``error``'s status (and ``trailing`` metadata besides). Raises
    AbortError as gRPC's abort does, except when the client has already gone: then there is no
    one to tell, and it returns quietly."""
    status = to_grpc_status(error)
    error.__traceback__ = None  # frames of the failed call must not outlive it
    try:
        await context.abort(status.code, status.details, (*status.trailing_metadata, *trailing))
    except grpc.aio.AbortError:
        raise
    except Exception as failure:
        if context.cancelled():
            return
        if not context.done():
            raise
        if _call_had_ended(failure):
            log.info(
                "could not end a call with %s: the caller had gone (cancelled, past its "
                "deadline or disconnected)",
                error.reason,
            )
        else:  # gRPC refused to send the status: say so, the call may linger
            log.warning("could not end a call with %s", error.reason, exc_info=True)


def _call_had_ended(failure: Exception) -> bool:
    """Whether a status could not be sent because the call was over: gRPC ran the batch and it
    failed ('Failed "execute_batch"'), as it does once the caller has cancelled, passed its
    deadline or lost its connection (``context.cancelled()`` cannot tell: ``abort`` has set
    the call's code to its own by then). Nobody is left to tell; no traceback is worth it. A
    batch gRPC refused to start ("Failed grpc_call_start_batch", too many operations) is this
    server's mistake, and keeps its traceback."""
    return type(failure).__name__ == "ExecuteBatchError" and str(failure).startswith(
        'Failed "execute_batch"'
    )
