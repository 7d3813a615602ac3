"""The helper pair the two Python clients call where they must differ (sessionlog_client._async_io
and _sync_io, the generated _sync.py calling the second where _aio.py calls the first): each
Reader gives a call's responses, None at its end or once the stream is closed, and TimeoutError
after a silence; only the wait counts as silence, not the time the caller holds a response."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import grpc
import pytest

from sessionlog_client import _async_io, _sync_io


class _Cancelled(grpc.RpcError):  # type: ignore[misc]
    """What a blocking gRPC call's iterator raises once the call is cancelled."""


class _BlockingCall:
    """A server-streaming call as grpc gives it: iterating waits for the next response."""

    def __init__(self, responses: list[Any], then_wait: bool) -> None:
        self._responses = list(responses)
        self._then_wait = then_wait
        self._cancelled = threading.Event()

    def __iter__(self) -> _BlockingCall:
        return self

    def __next__(self) -> Any:
        if self._responses:
            return self._responses.pop(0)
        if self._then_wait:
            self._cancelled.wait(30)
            raise _Cancelled()
        raise StopIteration

    def cancel(self) -> None:
        self._cancelled.set()


class _AsyncCall:
    """An asyncio server-streaming call: ``read()`` awaits the next response, EOF at the end."""

    def __init__(self, responses: list[Any], then_wait: bool) -> None:
        self._responses = list(responses)
        self._then_wait = then_wait
        self._cancelled = asyncio.Event()

    async def read(self) -> Any:
        if self._responses:
            return self._responses.pop(0)
        if self._then_wait:
            await asyncio.wait_for(self._cancelled.wait(), 30)
            raise asyncio.CancelledError()
        return grpc.aio.EOF

    def cancel(self) -> None:
        self._cancelled.set()


def test_the_blocking_reader_gives_the_responses_then_none_at_the_end() -> None:
    closed = threading.Event()
    reader = _sync_io.Reader(_BlockingCall(["a", "b"], then_wait=False), 5.0, closed)
    assert [reader.read(), reader.read(), reader.read()] == ["a", "b", None]
    reader.stop()


def test_the_blocking_reader_times_out_on_silence_not_while_the_caller_holds_a_response() -> None:
    closed = threading.Event()
    reader = _sync_io.Reader(_BlockingCall(["a"], then_wait=True), 0.3, closed)
    assert reader.read() == "a"
    time.sleep(0.6)  # the caller holds "a" for longer than the silence allowed: not a silence
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        reader.read()
    assert 0.2 < time.monotonic() - started < 10
    reader.stop()


def test_the_blocking_reader_gives_none_once_closed_from_another_thread() -> None:
    closed = threading.Event()
    call = _BlockingCall([], then_wait=True)
    reader = _sync_io.Reader(call, None, closed)

    def close() -> None:
        time.sleep(0.1)
        closed.set()
        call.cancel()

    threading.Thread(target=close, daemon=True).start()
    assert reader.read() is None


def test_the_asyncio_reader_behaves_as_the_blocking_one() -> None:
    async def scenario() -> list[Any]:
        closed = asyncio.Event()
        ended = _async_io.Reader(_AsyncCall(["a", "b"], then_wait=False), 5.0, closed)
        seen = [await ended.read(), await ended.read(), await ended.read()]
        silent = _async_io.Reader(_AsyncCall(["a"], then_wait=True), 0.3, closed)
        seen.append(await silent.read())
        await asyncio.sleep(0.6)
        with pytest.raises(TimeoutError):
            await silent.read()
        call = _AsyncCall([], then_wait=True)
        waiting = _async_io.Reader(call, None, closed)

        async def close() -> None:
            await asyncio.sleep(0.1)
            closed.set()
            call.cancel()

        closing = asyncio.create_task(close())
        seen.append(await waiting.read())
        await closing
        return seen

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == ["a", "b", None, "a", None]


def test_a_pause_ends_early_when_the_stream_closes() -> None:
    closed = threading.Event()
    threading.Timer(0.1, closed.set).start()
    started = time.monotonic()
    _sync_io.pause(closed, 20)
    assert time.monotonic() - started < 10

    async def scenario() -> float:
        flag = asyncio.Event()
        asyncio.get_running_loop().call_later(0.1, flag.set)
        begun = time.monotonic()
        await _async_io.pause(flag, 20)
        return time.monotonic() - begun

    assert asyncio.run(scenario()) < 10
