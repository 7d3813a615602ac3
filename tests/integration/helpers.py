"""Event builders and read-back helpers shared by the store integration tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sessionlog.storage.recording import RecordingTxn
from sessionlog.storage.store import Store, StoreConfig
from sessionlog.v1.event_pb2 import Event, EventType

USER = EventType.EVENT_TYPE_USER_MESSAGE
ASSISTANT = EventType.EVENT_TYPE_ASSISTANT_MESSAGE
SYSTEM = EventType.EVENT_TYPE_SYSTEM_MESSAGE
STEP_START = EventType.EVENT_TYPE_STEP_START


@contextmanager
def opened(path: Path, config: StoreConfig | None = None) -> Iterator[Store]:
    """A Store on ``path`` that is closed however the block ends."""
    store = Store(path, config)
    try:
        yield store
    finally:
        store.close()


class WriterGate:
    """A real writer command that holds the writer thread inside its transaction until released.

    Appends submitted while it is held queue up and are then taken as one group.
    """

    kind = "gate"
    session_id = ""
    moving_in = False

    def __init__(self, wait_seconds: float = 30) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self._wait_seconds = wait_seconds

    def apply(self, txn: RecordingTxn, now_ns: int) -> None:
        self.entered.set()
        assert self.release.wait(self._wait_seconds), "gate never released"

    def size(self) -> int:
        return 0

    def touched(self) -> list[str]:
        return []


def event(type_: int = USER, **data: Any) -> Event:
    """A fresh event of ``type_`` with ``data``; a new object every call (append stamps times)."""
    built = Event(type=type_)  # type: ignore[arg-type]
    built.data.update(data)
    return built


def user(content: str, **extra: Any) -> Event:
    """A user message event."""
    return event(USER, content=content, **extra)


def replace(content: str, start_seq: int, stop_seq: int) -> Event:
    """A system message that replaces positions [start_seq, stop_seq] on the surface."""
    built = event(SYSTEM, content=content)
    built.surface_op.replace.start_seq = start_seq
    built.surface_op.replace.stop_seq = stop_seq
    return built


def invalid() -> Event:
    """An event every append refuses: its type is unspecified (UNKNOWN_EVENT_TYPE)."""
    return event(EventType.EVENT_TYPE_UNSPECIFIED, content="nope")


def sid_of(store: Store, session_id: str) -> int:
    """The internal id of a session that must exist."""
    meta = store.meta(session_id)
    assert meta is not None, f"session {session_id!r} does not exist"
    return meta.sid


def read_all(store: Store, session_id: str) -> list[bytes]:
    """Every stored event of a session, as bytes, or [] for a session never written."""
    meta = store.meta(session_id)
    return [] if meta is None else store.read_events(meta.sid, 0)


def decoded(raws: list[bytes]) -> list[Event]:
    """Stored event bytes parsed back into events."""
    return [Event.FromString(raw) for raw in raws]


def contents(raws: list[bytes]) -> list[str]:
    """The data.content of each stored event."""
    return [e.data.fields["content"].string_value for e in decoded(raws)]
