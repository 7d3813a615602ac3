"""ImportSession's write against a real LMDB store: chunks land as one record each, a reopened
store still knows an imported session, and the verify walk finds nothing wrong with one."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionlog import errors, fold
from sessionlog.service.importing import prepare_import
from sessionlog.storage import integrity
from sessionlog.storage.store import Store
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.integration.helpers import opened

T0 = 1_700_000_000_000_000_000


def chunk(first_seq: int, count: int, **fields: object) -> pb.ImportSessionRequest:
    request = pb.ImportSessionRequest(session_id="imp", first_seq=first_seq, **fields)  # type: ignore[arg-type]
    for seq in range(first_seq, first_seq + count):
        event = request.events.add(type=event_pb2.EVENT_TYPE_USER_MESSAGE, seq=seq)
        event.time.FromNanoseconds(T0 + seq)
        event.data.update({"content": f"m{seq}"})
    return request


def imported(store: Store, request: pb.ImportSessionRequest, moving_in: bool = False) -> int:
    batch = prepare_import(request, fold.DEFAULT_LIMITS, moving_in=moving_in)
    return store.submit_import(batch).result().next_seq


def test_chunks_are_one_change_each_and_survive_a_reopen(tmp_path: Path) -> None:
    """Two chunks: two change records; reopened, the session takes the third chunk and
    refuses a gap; verify finds no problem."""
    with opened(tmp_path / "data") as store:
        before = store.head()[0]
        assert imported(store, chunk(0, 3)) == 3
        assert imported(store, chunk(3, 2)) == 5
        assert store.head()[0] == before + 2
    with opened(tmp_path / "data") as store:
        meta = store.meta("imp")
        assert meta is not None
        assert (meta.imported, meta.next_seq, meta.create_time_ns) == (True, 5, T0)
        assert meta.last_append_time_ns == T0 + 4
        assert imported(store, chunk(5, 1)) == 6
        with pytest.raises(errors.ImportSeqMismatch):
            imported(store, chunk(9, 1))
        assert store.next_seq("imp") == 6
        problems, _ = integrity.verify(store.env, store.tables)
        assert problems == []
