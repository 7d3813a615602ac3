"""AppendStream: many appends in flight on one bidirectional stream (issue 33).

Each request is one unary Append: the same use case (``SessionLog.submit_append``), so the same
checks in the same order (the group owns the session, this server takes writes, the caller's
token admits the session, the id, the events, the limits; then in the writer the request id,
the lease, expected_seq), and its own reply once its events are durable.

Invariants:
- requests are submitted to the writer in the order they arrive, each without waiting for the
  one before it to be answered: many of them share a group commit, and appends to one session
  apply in stream order (a chain of expected_seq values holds however many are in flight);
- replies go out in request order, each only after its own durable commit (and its replicas,
  with --ack replica), so a reply is an acknowledgement exactly as a unary Append's is;
- a refused request gets an ``AppendStreamError`` (the status code, message, reason and
  metadata a unary Append would have failed with) and changes nothing; the stream goes on;
- at most ``window`` requests are read and unanswered at once: past it the server stops
  reading, and HTTP/2 flow control holds the client back;
- the client's half-close ends the stream OK once every request read has been answered;
  shutdown stops reading, answers what is in flight, then ends the stream UNAVAILABLE (a
  request without a reply may or may not have been written: resend it with its request_id).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from sessionlog import errors, wire
from sessionlog.service import usecases
from sessionlog.service.convert import decode, encode_append_response
from sessionlog.service.counters import INTERNAL, OK, Counters
from sessionlog.service.errors import abort, refusal_level, status_code
from sessionlog.service.limits import StreamLimiter
from sessionlog.service.notifier import Notifier
from sessionlog.storage.store import AppendResult
from sessionlog.v1 import session_log_service_pb2 as pb

log = logging.getLogger(__name__)

METHOD = "AppendStream"
"""The method name the per-request counters are kept under."""

_REQUEST = pb.AppendStreamRequest.DESCRIPTOR.fields_by_name
_REPLY = pb.AppendStreamResponse.DESCRIPTOR.fields_by_name
_APPEND_FIELD = _REQUEST["append"].number
_CORRELATION_ID_FIELD = _REPLY["correlation_id"].number
_RESULT_APPEND_FIELD = _REPLY["append"].number
_RESULT_ERROR_FIELD = _REPLY["error"].number


@dataclass
class _InFlight:
    """One request read from the stream: its id, and its submitted append (or its refusal)."""

    correlation_id: int
    session_id: str
    outcome: asyncio.Future[AppendResult]
    started: float


_END = None
"""Put in the queue of requests in flight once the reader stops reading."""


class AppendStreams:
    """Serves AppendStream calls over one server's use cases."""

    def __init__(
        self,
        cases: usecases.SessionLog,
        counters: Counters,
        notifier: Notifier,
        streams: StreamLimiter,
        *,
        window: int,
        max_message_bytes: int,
    ) -> None:
        self.cases = cases
        self.counters = counters
        """Each request is counted as a call of ``METHOD``: its reason, its latency."""
        self.notifier = notifier
        self.streams = streams
        """Its replies' bytes are counted with the other streams' (``sent_bytes``)."""
        self.window = window
        self.max_message_bytes = max_message_bytes

    async def serve(
        self,
        requests: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext,
        caller: usecases.Caller,
        trailing: Callable[[], tuple[tuple[str, str], ...]],
    ) -> None:
        """Read requests, submit each at once, and answer them in order (module docstring).
        ``trailing``: the metadata the stream ends with (the server's epoch)."""
        slots = asyncio.Semaphore(self.window)
        in_flight: asyncio.Queue[_InFlight | None] = asyncio.Queue()
        reader = asyncio.ensure_future(self._read(requests, caller, slots, in_flight))
        reader.add_done_callback(lambda _: in_flight.put_nowait(_END))  # however it ended
        shutdown = self.notifier.closing()

        def stop_reading(_: object) -> None:
            reader.cancel()

        shutdown.add_done_callback(stop_reading)
        answering: _InFlight | None = None
        try:
            while (answering := await in_flight.get()) is not _END:
                reply = await self._answer(answering)
                await context.write(reply)
                slots.release()
            if shutdown.done():
                await abort(context, _shutting_down(), trailing())
                return
            await reader  # raises what ended the reader (the client's half-close: nothing)
            context.set_trailing_metadata(trailing())
        finally:
            shutdown.remove_done_callback(stop_reading)
            reader.cancel()
            reader.add_done_callback(_forget)
            # The call ended early (the client went away): what was submitted is still written,
            # in order (never a later append without an earlier one), and nobody hears of it.
            left: list[_InFlight | None] = [answering]
            while not in_flight.empty():
                left.append(in_flight.get_nowait())
            for request in left:
                if request is not None:
                    request.outcome.add_done_callback(_forget)

    async def _read(
        self,
        requests: AsyncIterator[bytes],
        caller: usecases.Caller,
        slots: asyncio.Semaphore,
        in_flight: asyncio.Queue[_InFlight | None],
    ) -> None:
        """Take requests while the window has room; submit each one as it comes."""
        iterator = aiter(requests)
        while True:
            await slots.acquire()
            try:
                raw = await anext(iterator)
            except StopAsyncIteration:
                return
            in_flight.put_nowait(self._submit(raw, caller))

    def _submit(self, raw: bytes, caller: usecases.Caller) -> _InFlight:
        """Decode one request and hand it to the writer before the next is read; a refusal
        becomes a future that already holds it (under the request's correlation id, whenever
        the request's framing lets it be read)."""
        started = time.perf_counter()
        correlation_id, session_id = 0, ""
        try:
            correlation_id, appends = _split(raw)
            if len(raw) > self.max_message_bytes:
                raise errors.RequestTooLarge(
                    f"the request is {len(raw)} bytes, over the {self.max_message_bytes}-byte "
                    "message limit (--max-message-size); split it into smaller appends",
                    size=len(raw),
                    limit=self.max_message_bytes,
                )
            if not appends:
                raise _malformed("the request has no append: set AppendStreamRequest.append")
            request = decode(pb.AppendRequest, b"".join(appends))
            session_id = request.session_id
            outcome = self.cases.submit_append(caller, request)
        except errors.SessionLogError as error:
            outcome = _refused(error)
        except Exception:  # a fault of this server: that request's INTERNAL, as unary Append's
            log.exception("unexpected failure in %s", METHOD)
            outcome = _refused(errors.SessionLogError(f"internal error in {METHOD}; see the log"))
        return _InFlight(correlation_id, session_id, outcome, started)

    async def _answer(self, request: _InFlight) -> bytes:
        """The reply to one request once its append is acknowledged, or its error."""
        header = wire.uint_field(_CORRELATION_ID_FIELD, request.correlation_id)
        try:
            # shielded: a call that ends now must not cancel an append already queued
            result = await self.cases.acknowledged(asyncio.shield(request.outcome))
        except errors.SessionLogError as error:
            reason, reply = error.reason, header + _error_field(error)
            log.log(
                refusal_level(error), "request refused", extra={"method": METHOD, "reason": reason}
            )
        except Exception:
            log.exception("unexpected failure in %s", METHOD)
            failure = errors.SessionLogError(f"internal error in {METHOD}; see the server log")
            reason, reply = INTERNAL, header + _error_field(failure)
        else:
            reason = OK
            reply = header + wire.message_field(
                _RESULT_APPEND_FIELD, encode_append_response(result, request.session_id)
            )
            self._note_drops(request.session_id, result)
        self.counters.record(METHOD, reason, time.perf_counter() - request.started, 0)
        self.streams.sent_bytes += len(reply)
        return reply

    def _note_drops(self, session_id: str, result: AppendResult) -> None:
        for index, reason, _ in result.drops:
            self.counters.dropped(reason)
            log.warning(
                "lenient append dropped an event",
                extra={"session_id": session_id, "index": index, "reason": reason},
            )


def _error_field(error: errors.SessionLogError) -> bytes:
    """The ``error`` result of a reply: what a unary Append's status would have said."""
    failure = pb.AppendStreamError(
        code=status_code(error).value[0],
        message=error.message,
        reason=error.reason,
        metadata=error.metadata,
    )
    return wire.message_field(_RESULT_ERROR_FIELD, failure.SerializeToString())


def _refused(error: errors.SessionLogError) -> asyncio.Future[AppendResult]:
    """A request's outcome that is its refusal, known before anything was submitted."""
    outcome: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
    outcome.set_exception(error)
    return outcome


def _split(raw: bytes) -> tuple[int, list[bytes]]:
    """A request's correlation id and the bytes of its append field (each occurrence: protobuf
    merges them), the append left undecoded so that one that fails to decode is still answered
    under its correlation id."""
    try:
        rest, appends = wire.split_field(raw, _APPEND_FIELD)
        return pb.AppendStreamRequest.FromString(rest).correlation_id, appends
    except (ValueError, DecodeError):
        raise _malformed("the request could not be decoded as AppendStreamRequest") from None


def _malformed(what: str) -> errors.MalformedRequest:
    name = pb.AppendStreamRequest.DESCRIPTOR.full_name
    return errors.MalformedRequest(
        f"{what}; send one {name} per message, each with its append", message_type=name
    )


def _shutting_down() -> errors.Unavailable:
    return errors.Unavailable(
        "the server is shutting down; every request answered before this is settled: reconnect "
        "and send the others again (with their request_id a resend never writes twice)"
    )


def _forget(outcome: asyncio.Future[Any]) -> None:
    """Retrieve an outcome nobody will read (asyncio would log it as never retrieved)."""
    if not outcome.cancelled():
        outcome.exception()
