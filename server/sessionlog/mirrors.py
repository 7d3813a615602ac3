"""Mirror messages: responses that carry stored bytes, encoded by generated code.

Stored events (and change records) go out exactly as stored: parsing and re-serializing them
would cost about 70 times more than sending the bytes. A *mirror* of a response message is the
same message with each field that carries stored bytes declared ``bytes`` instead of its message
type: ``repeated Event events = 1`` becomes ``repeated bytes events = 1``. Both have the same
wire format, so the mirror's ``SerializeToString`` gives exactly what the real message would, and
a client parses it as the real message.

Each mirror is derived at import from the real message's generated descriptor (names, numbers,
labels and every other field unchanged), so no field number is ever copied and a mirror cannot
drift from the proto. ``bench/encode.py`` measures each reply both ways; the server uses the
mirror wherever the generated encoder was not slower (Since batches stay with ``wire``).
Mirrors live in their own file of the default descriptor pool, package
``sessionlog.mirror``, which no service names: reflection never shows them.

Two mirrors read rather than write. ``AppendRequest`` takes a request's events out of its
bytes as they are (``event_bodies``). ``PlainEvents`` parses a batch of serialized events with
only what a plain event may hold declared (a type, and data whose values are strings or nulls),
so that anything else in any event (a time, a usage, a number, a nested object, an unknown
field) is an unknown field to it. ``fold.doubtful_events`` finds those in a few calls into the
protobuf runtime for the whole batch instead of reading every event's data from Python.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.struct_pb2 import Struct, Value

from sessionlog.v1 import event_pb2
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb

PACKAGE = "sessionlog.mirror"

MIRRORED: dict[str, tuple[Any, tuple[str, ...]]] = {
    "SinceResponse": (pb.SinceResponse.DESCRIPTOR, ("events",)),
    "AppendResponse": (pb.AppendResponse.DESCRIPTOR, ("events",)),
    "CreateSessionResponse": (pb.CreateSessionResponse.DESCRIPTOR, ("events",)),
    "SeedSessionResponse": (pb.SeedSessionResponse.DESCRIPTOR, ("events",)),
    "DeriveMessagesResponse": (pb.DeriveMessagesResponse.DESCRIPTOR, ("messages",)),
    "ChangesResponse": (rpb.ChangesResponse.DESCRIPTOR, ("changes",)),
    "AppendRequest": (pb.AppendRequest.DESCRIPTOR, ("events",)),
}
"""Each mirror's name, the real message it mirrors, and the fields that carry stored bytes."""


def _mirror_proto(real: Any, as_bytes: tuple[str, ...]) -> descriptor_pb2.DescriptorProto:
    """The real message's declaration with the ``as_bytes`` fields turned into bytes fields."""
    proto = descriptor_pb2.DescriptorProto()
    real.CopyToProto(proto)
    for declared in proto.field:
        if declared.name in as_bytes:
            if declared.type != descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE:
                raise TypeError(f"{real.full_name}.{declared.name} does not hold a message")
            declared.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
            declared.ClearField("type_name")
    return proto


def _build() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(
        name="sessionlog/mirror/mirrors.proto", package=PACKAGE, syntax="proto3"
    )
    dependencies: list[str] = []
    for real, as_bytes in MIRRORED.values():
        for name in (real.file.name, *(d.name for d in real.file.dependencies)):
            if name not in dependencies:
                dependencies.append(name)
        file.message_type.append(_mirror_proto(real, as_bytes))
    file.dependency.extend(dependencies)
    pool = descriptor_pool.Default()
    pool.AddSerializedFile(file.SerializeToString())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in MIRRORED
    }


_CLASSES = _build()
SinceResponse: Any = _CLASSES["SinceResponse"]
AppendResponse: Any = _CLASSES["AppendResponse"]
CreateSessionResponse: Any = _CLASSES["CreateSessionResponse"]
SeedSessionResponse: Any = _CLASSES["SeedSessionResponse"]
DeriveMessagesResponse: Any = _CLASSES["DeriveMessagesResponse"]
ChangesResponse: Any = _CLASSES["ChangesResponse"]
AppendRequest: Any = _CLASSES["AppendRequest"]
"""Read, not written: a serialized AppendRequest parsed as this holds each event's bytes."""


def event_bodies(request: pb.AppendRequest) -> list[bytes]:
    """Each event of a request as its own ``SerializeToString`` gives it, taken from the
    request serialized whole: one call into the runtime, not one per event (a message's bytes
    hold each of its events' bytes as they are)."""
    return list(AppendRequest.FromString(request.SerializeToString()).events)


# -- PlainEvents: a batch of events read as plain events ----------------------------------------

_Field = descriptor_pb2.FieldDescriptorProto


def _narrowed(real: Any, name: str, keep: tuple[str, ...]) -> descriptor_pb2.DescriptorProto:
    """The real message's declaration renamed, with only the ``keep`` fields (each unchanged)."""
    proto = descriptor_pb2.DescriptorProto()
    real.CopyToProto(proto)
    proto.name = name
    kept = [declared for declared in proto.field if declared.name in keep]
    if [declared.name for declared in kept] != list(keep):
        raise TypeError(f"{real.full_name} does not declare {keep}")
    del proto.field[:]
    proto.field.extend(kept)
    return proto


def _plain_protos() -> list[descriptor_pb2.DescriptorProto]:
    """PlainEvents { repeated PlainEvent events = 1 }; PlainEvent is Event with only its type
    and data; PlainStruct is Struct with its map declared as the repeated entry messages a map
    is on the wire (the runtime then drops unknown fields inside them too, and an entry is
    written back as a map writes it); PlainValue is Value with only its null and string kinds."""
    value = _narrowed(Value.DESCRIPTOR, "PlainValue", ("null_value", "string_value"))
    struct = _narrowed(Struct.DESCRIPTOR, "PlainStruct", ("fields",))
    (entry,) = struct.nested_type
    entry.ClearField("options")  # no longer a map entry: a message of its own
    for declared in entry.field:
        if declared.name == "key":
            # A map entry writes its key even when empty: a key with presence does too.
            declared.proto3_optional = True
            declared.oneof_index = len(entry.oneof_decl)
            entry.oneof_decl.add(name="_key")
        elif declared.name == "value":
            declared.type_name = f".{PACKAGE}.PlainValue"
    struct.field[0].type_name = f".{PACKAGE}.PlainStruct.{entry.name}"
    event = _narrowed(event_pb2.Event.DESCRIPTOR, "PlainEvent", ("type", "data"))
    for container in ("nested_type", "enum_type", "oneof_decl"):
        event.ClearField(container)
    event.field[1].type_name = f".{PACKAGE}.PlainStruct"
    events = descriptor_pb2.DescriptorProto(name="PlainEvents")
    events.field.add(
        name="events",
        number=1,
        label=_Field.LABEL_REPEATED,
        type=_Field.TYPE_MESSAGE,
        type_name=f".{PACKAGE}.PlainEvent",
    )
    return [value, struct, event, events]


def _build_plain() -> Any:
    file = descriptor_pb2.FileDescriptorProto(
        name="sessionlog/mirror/plain.proto", package=PACKAGE, syntax="proto3"
    )
    file.dependency.extend([event_pb2.DESCRIPTOR.name, Struct.DESCRIPTOR.file.name])
    file.message_type.extend(_plain_protos())
    pool = descriptor_pool.Default()
    pool.AddSerializedFile(file.SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.PlainEvents"))


PlainEvents: Any = _build_plain()
"""Serialized events read as plain events: ``events`` (field 1) is a repeated PlainEvent."""
