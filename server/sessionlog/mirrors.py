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
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

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
