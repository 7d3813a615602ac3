"""Mirror messages keep the real messages' field numbers, and encode what the real ones do."""

from __future__ import annotations

from sessionlog import mirrors
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1.event_pb2 import Event, EventType


def _fields(descriptor: object) -> list[tuple[str, int, bool]]:
    fields = descriptor.fields  # type: ignore[attr-defined]
    return [(f.name, f.number, f.is_repeated) for f in fields]


def test_each_mirror_has_its_real_messages_fields() -> None:
    """Names, numbers and repetition match the real message; only the stored-bytes fields differ,
    and they are bytes."""
    for name, (real, as_bytes) in mirrors.MIRRORED.items():
        mirror = getattr(mirrors, name).DESCRIPTOR
        assert _fields(mirror) == _fields(real), name
        for field in mirror.fields:
            if field.name in as_bytes:
                assert field.type == field.TYPE_BYTES, (name, field.name)
            else:
                assert field.type == real.fields_by_name[field.name].type, (name, field.name)


def test_mirrors_encode_the_bytes_of_the_real_message() -> None:
    """Stored events sent through a mirror parse as, and equal, the real response's bytes."""
    event = Event(seq=7, type=EventType.EVENT_TYPE_USER_MESSAGE)
    event.data.update({"content": "hi"})
    stored = [event.SerializeToString()] * 3
    drops = [pb.AppendDrop(index=1, reason="INVALID_SURFACE_OP", message="no")]
    mirrored = mirrors.AppendResponse(events=stored, next_seq=8, drops=drops)
    real = pb.AppendResponse(events=[event] * 3, next_seq=8, drops=drops)
    assert mirrored.SerializeToString() == real.SerializeToString()
    change = rpb.Change(position=3, session_id="s").SerializeToString()
    feed = mirrors.ChangesResponse(changes=[change], head_position=3, history_id="h")
    parsed = rpb.ChangesResponse.FromString(feed.SerializeToString())
    assert (parsed.changes[0].position, parsed.head_position, parsed.history_id) == (3, 3, "h")


def test_mirrors_are_not_part_of_the_api_package() -> None:
    """Mirrors live in their own package, so no service or reflection listing names them."""
    for name in mirrors.MIRRORED:
        assert getattr(mirrors, name).DESCRIPTOR.full_name == f"sessionlog.mirror.{name}"
