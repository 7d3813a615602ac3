"""ImportSession's pure parts: the imported flag in the session record's format byte, and a
chunk's checks that need no stored state (seqs in line, the request records' limit)."""

from __future__ import annotations

import pytest

from sessionlog import errors, fold
from sessionlog.service.importing import prepare_import
from sessionlog.storage import imports, schema
from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb


def user(seq: int) -> event_pb2.Event:
    made = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE, seq=seq)
    made.data.update({"content": f"m{seq}"})
    return made


def test_the_imported_flag_is_the_format_byte() -> None:
    """An imported session's record starts with META_FORMAT_IMPORTED and reads back flagged;
    any other keeps META_FORMAT, unflagged."""
    meta = schema.SessionMeta(7, 3, 1, 10, 20, "parent", 2, imported=True)
    raw = meta.encode()
    assert raw[0] == schema.META_FORMAT_IMPORTED
    assert schema.SessionMeta.decode(raw) == meta
    plain = schema.SessionMeta(8, 1, 0, 10, 20)
    assert plain.encode()[0] == schema.META_FORMAT
    assert not schema.SessionMeta.decode(plain.encode()).imported


def test_a_chunk_keeps_its_times_and_clears_its_seqs() -> None:
    """The seqs are checked then cleared (the writer numbers the stored events); times kept."""
    request = pb.ImportSessionRequest(session_id="s", first_seq=4, events=[user(4), user(5)])
    request.events[1].time.FromNanoseconds(1_000_000_000_123_456_000)
    batch = prepare_import(request, fold.DEFAULT_LIMITS, moving_in=False)
    assert batch.first_seq == 4
    assert batch.last_event_time_ns == 1_000_000_000_123_456_000
    assert [event.seq for event in batch.events.events] == [0, 0]
    assert len(batch.events.bodies) == 2
    assert (batch.create_time_ns, batch.last_append_time_ns) == (None, None)


@pytest.mark.parametrize("seqs", [[0, 2], [1], [0, 0]])
def test_seqs_out_of_line_are_refused(seqs: list[int]) -> None:
    """Each event's seq must be first_seq + its index: IMPORT_SEQ_NOT_DENSE names the index."""
    request = pb.ImportSessionRequest(session_id="s", events=[user(seq) for seq in seqs])
    with pytest.raises(errors.ImportSeqNotDense) as caught:
        prepare_import(request, fold.DEFAULT_LIMITS, moving_in=False)
    wrong = next(i for i, seq in enumerate(seqs) if seq != i)
    assert caught.value.metadata["index"] == str(wrong)


def test_too_many_request_records_are_refused() -> None:
    request = pb.ImportSessionRequest(session_id="s")
    request.request_records.extend(
        pb.SessionRequestRecord(request_id=f"r{n}") for n in range(imports.MAX_REQUEST_RECORDS + 1)
    )
    with pytest.raises(errors.MalformedRequest):
        prepare_import(request, fold.DEFAULT_LIMITS, moving_in=True)
