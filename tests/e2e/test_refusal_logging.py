"""How a refusal is logged when its caller has already gone (issue 29, item 8): a deposed
leader logged "could not end a call with LEADERSHIP_LOST" with a traceback for a write whose
caller had cancelled. Now one line, no traceback; a caller still there gets its status.

A real gRPC server in this process on port 0 and a real client; the handler ends its call
through ``service.errors.abort``, as every sessionlog handler does."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from sessionlog import errors
from sessionlog.service.errors import abort
from tests.e2e._helpers import check

METHOD = "/test.Refusals/Write"


async def refusing_server(
    cancelled_first: bool, done: asyncio.Event
) -> tuple[grpc.aio.Server, int]:
    """A server whose one method refuses with LEADERSHIP_LOST; with ``cancelled_first``, only
    once its caller has cancelled (the cancel reaches the handler as CancelledError, which it
    outlives: a deposed leader's write failing just as its caller gives up)."""

    async def write(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            if cancelled_first:
                await asyncio.sleep(60)  # until the caller cancels
        except asyncio.CancelledError:
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()
        try:
            await abort(context, errors.LeadershipLost("this server has lost its leadership"))
        finally:
            done.set()
        return b""

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(write)
    service = grpc.method_handlers_generic_handler("test.Refusals", {"Write": handler})
    server.add_generic_rpc_handlers((service,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def test_a_refusal_whose_caller_cancelled_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """The caller cancels, then the handler refuses: one INFO line naming the reason and that
    the caller had gone, no traceback, and nothing else logged above INFO."""
    caplog.set_level(logging.INFO)

    async def scenario() -> None:
        done = asyncio.Event()
        server, port = await refusing_server(cancelled_first=True, done=done)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(METHOD)(b"write")
                await asyncio.sleep(0.2)  # the call reaches the handler
                call.cancel()
                await asyncio.wait_for(done.wait(), 10)
                await asyncio.sleep(0.2)  # gRPC's own handling of the call's end, if it logs
        finally:
            await server.stop(None)

    asyncio.run(scenario())
    mine = [r for r in caplog.records if "could not end a call" in r.getMessage()]
    assert len(mine) == 1, caplog.text
    assert mine[0].levelno == logging.INFO
    assert mine[0].exc_info is None
    assert "LEADERSHIP_LOST" in mine[0].getMessage()
    assert "the caller had gone" in mine[0].getMessage()
    assert "Traceback" not in caplog.text
    assert [r.getMessage() for r in caplog.records if r.levelno > logging.INFO] == []


def test_a_caller_still_waiting_gets_the_refusal(caplog: pytest.LogCaptureFixture) -> None:
    """The same refusal with the caller waiting: it gets UNAVAILABLE / LEADERSHIP_LOST, and
    nothing is logged about ending the call."""
    caplog.set_level(logging.INFO)

    async def scenario() -> grpc.aio.AioRpcError:
        server, port = await refusing_server(cancelled_first=False, done=asyncio.Event())
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await channel.unary_unary(METHOD)(b"write", timeout=10)
                return caught.value
        finally:
            await server.stop(None)

    check(asyncio.run(scenario()), grpc.StatusCode.UNAVAILABLE, "LEADERSHIP_LOST")
    assert "could not end a call" not in caplog.text
