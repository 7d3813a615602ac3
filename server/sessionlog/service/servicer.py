"""SessionLogService over gRPC: decode, call the store, encode. Nothing else.

Handlers take and return raw bytes. Decoding here, not in grpc's deserializer, turns any request
that fails to parse (bad UTF-8, Struct nested past the protobuf runtime's recursion limit) into
INVALID_ARGUMENT / MALFORMED_REQUEST instead of grpc's INTERNAL; and returning bytes lets stored
events go out exactly as stored, with no parse and no re-serialize.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from sessionlog import errors, fold, wire
from sessionlog.service.errors import to_grpc_status
from sessionlog.service.notifier import Notifier
from sessionlog.storage.store import AppendResult, Store, prepare_append
from sessionlog.v1 import session_log_service_pb2 as pb

log = logging.getLogger(__name__)

SERVICE_NAME = "sessionlog.v1.SessionLogService"

M = TypeVar("M", bound=Message)
Handler = Callable[[Any, bytes, grpc.aio.ServicerContext], Awaitable[bytes]]


def decode(message_type: type[M], raw: bytes) -> M:
    """Parse a request, or raise MalformedRequest saying what it should have been."""
    try:
        message: M = message_type.FromString(raw)
    except (DecodeError, RecursionError, ValueError) as exc:
        name = message_type.DESCRIPTOR.full_name
        raise errors.MalformedRequest(
            f"the request could not be decoded as {name} ({exc}); check the message type, that "
            "strings are valid UTF-8, and that data is nested no deeper than the limit",
            message_type=name,
        ) from None
    return message


async def abort(context: grpc.aio.ServicerContext, error: errors.SessionLogError) -> None:
    status = to_grpc_status(error)
    await context.abort(status.code, status.details, status.trailing_metadata)


async def abort_unexpected(context: grpc.aio.ServicerContext, method: str) -> None:
    log.exception("unexpected failure in %s", method)
    await abort(context, errors.SessionLogError(f"internal error in {method}; see the server log"))


def unary(method: Handler) -> Handler:
    """Turn a raised SessionLogError into its status; anything else into INTERNAL, logged."""

    @functools.wraps(method)
    async def handler(self: Any, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            return await method(self, request, context)
        except errors.SessionLogError as error:
            await abort(context, error)
        except Exception:
            await abort_unexpected(context, method.__name__)
        raise AssertionError("unreachable: abort raises")

    return handler


def encode_events(events: list[bytes]) -> bytes:
    """A `repeated Event events = 1` field from stored event bytes."""
    return wire.length_delimited(1, events)


def encode_append_response(result: AppendResult) -> bytes:
    drops = [
        pb.AppendDrop(index=i, reason=reason, message=message).SerializeToString()
        for i, reason, message in result.drops
    ]
    return (
        encode_events(result.events)
        + wire.uint_field(2, result.next_seq)
        + wire.length_delimited(3, drops)
    )


class SessionLogServicer:
    """The four core RPCs of SPEC §8."""

    def __init__(
        self,
        store: Store,
        notifier: Notifier,
        *,
        since_batch_bytes: int = 256 << 10,
        heartbeat_seconds: float = 15.0,
    ) -> None:
        self.store = store
        self.notifier = notifier
        self.since_batch_bytes = since_batch_bytes
        self.heartbeat_seconds = heartbeat_seconds

    def handlers(self) -> grpc.GenericRpcHandler:
        """Method handlers that pass raw bytes in and out (see the module docstring)."""
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Append": grpc.unary_unary_rpc_method_handler(self.append),
                "Since": grpc.unary_stream_rpc_method_handler(self.since),
                "Surface": grpc.unary_unary_rpc_method_handler(self.surface),
                "DeriveMessages": grpc.unary_unary_rpc_method_handler(self.derive_messages),
            },
        )

    @unary
    async def append(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.AppendRequest, raw)
        batch = prepare_append(
            request.session_id,
            request.events,
            limits=self.store.config.limits,
            expected_seq=request.expected_seq if request.HasField("expected_seq") else None,
            request_id=request.request_id,
            lease_holder=request.lease_holder,
            lenient=request.lenient,
        )
        result = await asyncio.wrap_future(self.store.submit_append(batch))
        for index, reason, _ in result.drops:
            log.warning(
                "lenient append dropped an event",
                extra={"session_id": request.session_id, "index": index, "reason": reason},
            )
        return encode_append_response(result)

    async def since(self, raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Stored events from seq on in byte-bounded batches; with follow, then live ones."""
        try:
            request = decode(pb.SinceRequest, raw)
            fold.check_session_id(request.session_id)
        except errors.SessionLogError as error:
            await abort(context, error)
            return
        session_id, cursor, follow = request.session_id, request.seq, request.follow
        waiter: asyncio.Future[None] | None = None
        sid: int | None = None
        caught_up = False
        try:
            while True:
                if follow and (waiter is None or waiter.done()):
                    if waiter is not None:
                        self.notifier.discard(session_id, waiter)
                    waiter = self.notifier.register(session_id)
                if self.notifier.closed:
                    await abort(context, _shutting_down(session_id, cursor))
                    return
                if sid is None:
                    meta = self.store.meta(session_id)
                    sid = None if meta is None else meta.sid
                batch = (
                    []
                    if sid is None
                    else self.store.read_events(sid, cursor, max_bytes=self.since_batch_bytes)
                )
                if batch:
                    cursor += len(batch)
                    yield encode_events(batch)
                    continue
                if not follow or waiter is None:
                    return
                if not caught_up:
                    caught_up = True
                    yield wire.uint_field(2, 1) + wire.uint_field(3, self._next_seq(session_id))
                done, _ = await asyncio.wait({waiter}, timeout=self.heartbeat_seconds)
                if not done:
                    yield wire.uint_field(3, self._next_seq(session_id))
        except errors.SessionLogError as error:
            await abort(context, error)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            await abort_unexpected(context, "Since")
        finally:
            if waiter is not None:
                self.notifier.discard(session_id, waiter)

    def _next_seq(self, session_id: str) -> int:
        meta = self.store.meta(session_id)
        return 0 if meta is None else meta.next_seq

    @unary
    async def surface(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.SurfaceRequest, raw)
        fold.check_session_id(request.session_id)
        at_seq = request.at_seq if request.HasField("at_seq") else None
        folded = self.store.surface(request.session_id, at_seq)
        response = pb.SurfaceResponse(
            events=folded.surface,
            event_count=folded.count,
            replace_generation=folded.replace_generation,
        )
        serialized: bytes = response.SerializeToString()
        return serialized

    @unary
    async def derive_messages(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(pb.DeriveMessagesRequest, raw)
        fold.check_session_id(request.session_id)
        at_seq = request.at_seq if request.HasField("at_seq") else None
        folded = self.store.surface(request.session_id, at_seq)
        return (
            wire.length_delimited(1, folded.projected())
            + wire.packed_uints(2, folded.seqs)
            + wire.uint_field(3, folded.count)
            + wire.uint_field(4, folded.replace_generation)
        )


def _shutting_down(session_id: str, cursor: int) -> errors.Unavailable:
    return errors.Unavailable(
        f"the server is shutting down; reconnect and resume session '{session_id}' from seq "
        f"{cursor}",
        next_seq=cursor,
    )
