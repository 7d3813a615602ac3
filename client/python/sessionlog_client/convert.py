"""Plain Python values <-> sessionlog protos: events from dicts, messages in the OpenAI chat format.

A worker usually speaks the chat format of its model API: a list of dicts with ``role``,
``content``, ``tool_calls``, ``tool_call_id`` and ``name``. These helpers turn derived messages
into that format and model replies back into events, so no worker has to touch ``Struct``::

    >>> from sessionlog_client import event, message_to_dict, event_from_message
    >>> event("user_message", {"content": "hi"}).type == event_type("user_message")
    True
    >>> event_from_message({"role": "assistant", "content": "hello"}).data["content"]
    'hello'

Rules, both ways:

- Roles are ``system``, ``user``, ``assistant``, ``tool`` (``developer`` is read as ``system``).
- ``content`` is a string or None. A list (OpenAI's multi-part content) is kept in
  ``metadata.content_parts``, where the SPEC puts multi-part content, and comes back as the list.
- A field absent from the message stays absent from the dict (``content`` is always present,
  None when absent, since chat APIs expect the key); ``tool_calls`` only when there are some.
- JSON has one number type, and ``Struct`` holds every number as a double: a whole number read
  back from a ``Struct`` is an ``int`` (:func:`whole_numbers`), exactly so within 2^53; beyond
  that a double cannot hold every integer, so such numbers stay floats (send larger integers,
  ids and token counts past 2^53, as strings).
- Keys of the dict that are not message fields are ignored (the server would never project them).
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message as ProtoMessage
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from sessionlog_client.v1.event_pb2 import Event, EventType, Usage
from sessionlog_client.v1.message_pb2 import Message, Role
from sessionlog_client.v1.session_log_service_pb2 import ModelUsage

__all__ = [
    "enum_name",
    "event",
    "event_from_dict",
    "event_from_message",
    "event_to_dict",
    "event_type",
    "message_from_dict",
    "message_to_dict",
    "message_to_json",
    "messages_from_dicts",
    "messages_to_dicts",
    "role_name",
    "struct_to_dict",
    "type_name",
    "whole_numbers",
]

_TYPE_PREFIX = "EVENT_TYPE_"
_ROLES: dict[str, Role] = {
    "system": Role.ROLE_SYSTEM,
    "developer": Role.ROLE_SYSTEM,
    "user": Role.ROLE_USER,
    "assistant": Role.ROLE_ASSISTANT,
    "tool": Role.ROLE_TOOL,
}
_ROLE_NAMES: dict[int, str] = {
    Role.ROLE_SYSTEM: "system",
    Role.ROLE_USER: "user",
    Role.ROLE_ASSISTANT: "assistant",
    Role.ROLE_TOOL: "tool",
}
_EVENT_OF_ROLE: dict[int, EventType] = {
    Role.ROLE_SYSTEM: EventType.EVENT_TYPE_SYSTEM_MESSAGE,
    Role.ROLE_USER: EventType.EVENT_TYPE_USER_MESSAGE,
    Role.ROLE_ASSISTANT: EventType.EVENT_TYPE_ASSISTANT_MESSAGE,
    Role.ROLE_TOOL: EventType.EVENT_TYPE_TOOL_RESULT,
}
_STRING_FIELDS = ("content", "reasoning_content", "tool_call_id", "name")

TimeLike = dt.datetime | str | Timestamp


# -- events ---------------------------------------------------------------------------------------


def event_type(name: str | int) -> EventType:
    """``"user_message"``, ``"USER_MESSAGE"`` or ``"EVENT_TYPE_USER_MESSAGE"`` -> the enum value.

    >>> event_type("tool_result") == EventType.EVENT_TYPE_TOOL_RESULT
    True
    """
    if isinstance(name, int):
        return cast(EventType, name)  # passed through: the server judges unknown values
    key = name.strip().upper()
    if not key.startswith(_TYPE_PREFIX):
        key = _TYPE_PREFIX + key
    try:
        return cast(EventType, EventType.Value(key))
    except ValueError:
        known = ", ".join(type_name(v) for v in EventType.values()[1:])
        raise ValueError(f"unknown event type {name!r}; one of: {known}") from None


def type_name(value: int) -> str:
    """The short lower-case name of a type: ``EVENT_TYPE_USER_MESSAGE`` -> ``user_message``."""
    return EventType.Name(value)[len(_TYPE_PREFIX) :].lower()


def event(
    type: str | int,
    data: Mapping[str, Any] | None = None,
    *,
    replace: tuple[int, int] | Sequence[int] | None = None,
    time: TimeLike | None = None,
    state_delta: Mapping[str, Any] | None = None,
    usage: Mapping[str, Any] | Usage | None = None,
) -> Event:
    """An event ready to append.

    ``replace=(start, stop)`` makes it a replace of positions start..stop (inclusive); ``time``
    (an aware datetime, an RFC 3339 string or a Timestamp) is stored exactly, else the server
    stamps it. ``state_delta`` changes the session's state (``get_state``): each key replaces
    the state's key, a None deletes it. ``usage`` records the tokens a model call spent
    (``{"model": ..., "input_tokens": ..., "output_tokens": ..., "cached_input_tokens": ...,
    "reasoning_tokens": ...}``, counts defaulting to 0), summed by ``get_usage``.

    >>> summary = event("system_message", {"content": "[summary]"}, replace=(1, 2))
    >>> summary.surface_op.replace.stop_seq
    2
    """
    built = Event(type=event_type(type))
    if data:
        built.data.update(dict(data))
    if replace is not None:
        start, stop = replace
        built.surface_op.replace.start_seq = int(start)
        built.surface_op.replace.stop_seq = int(stop)
    if time is not None:
        built.time.CopyFrom(_timestamp(time))
    if state_delta is not None:
        built.state_delta.update(dict(state_delta))
    if usage is not None:
        built.usage.CopyFrom(usage if isinstance(usage, Usage) else Usage(**dict(usage)))
    return built


def event_from_dict(value: Mapping[str, Any] | Event) -> Event:
    """``{"type": ..., "data": {...}, "replace": [start, stop], "time": ..., "state_delta": {...},
    "usage": {...}}`` -> an Event.

    Only ``type`` is required; an Event passes through unchanged.

    >>> event_from_dict({"type": "user_message", "data": {"content": "hi"}}).data["content"]
    'hi'
    """
    if isinstance(value, Event):
        return value
    if "type" not in value:
        raise ValueError(f"an event needs a type: {dict(value)!r}")
    return event(
        value["type"],
        value.get("data"),
        replace=value.get("replace"),
        time=value.get("time"),
        state_delta=value.get("state_delta"),
        usage=value.get("usage"),
    )


def event_to_dict(value: Event) -> dict[str, Any]:
    """An Event as plain values: seq, type (short name), time (aware datetime), data, replace,
    state_delta, usage.

    ``replace`` is present only on replace events, as ``[start_seq, stop_seq]``; ``state_delta``
    and ``usage`` (a dict of model and every count) only on events that carry one.
    """
    out: dict[str, Any] = {
        "seq": value.seq,
        "type": type_name(value.type),
        "time": value.time.ToDatetime(tzinfo=dt.UTC) if value.HasField("time") else None,
        "data": struct_to_dict(value.data),
    }
    if value.surface_op.WhichOneof("kind") == "replace":
        r = value.surface_op.replace
        out["replace"] = [r.start_seq, r.stop_seq]
    if value.HasField("state_delta"):
        out["state_delta"] = struct_to_dict(value.state_delta)
    if value.HasField("usage"):
        out["usage"] = {f.name: getattr(value.usage, f.name) for f in Usage.DESCRIPTOR.fields}
    return out


_USAGE_COUNTS = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")


def usage_to_dict(usages: Iterable[ModelUsage]) -> dict[str, dict[str, int]]:
    """Usage totals (``GetUsageResponse.usage``, ``Session.usage``, a page's ``usage_total``)
    as ``{model: {"input_tokens": ..., "output_tokens": ..., "cached_input_tokens": ...,
    "reasoning_tokens": ..., "event_count": ...}}``, in the server's model order."""
    return {
        u.model: {name: getattr(u, name) for name in (*_USAGE_COUNTS, "event_count")}
        for u in usages
    }


def event_from_message(
    message: Mapping[str, Any] | Message, *, replace: tuple[int, int] | None = None
) -> Event:
    """A chat message (dict or Message) -> the surface event that projects back to it.

    This is how a worker logs a model's reply::

        reply = model(messages)  # {"role": "assistant", "content": ..., "tool_calls": [...]}
        client.append(session, [event_from_message(reply)])

    A role the server has no event type for raises ValueError.
    """
    msg = message if isinstance(message, Message) else message_from_dict(message)
    kind = _EVENT_OF_ROLE.get(msg.role)
    if kind is None:
        raise ValueError(f"no event type for role {Role.Name(msg.role)}")
    built = Event(type=kind)
    data: dict[str, Any] = {}
    for name in _STRING_FIELDS:
        if msg.HasField(name):
            data[name] = getattr(msg, name)
    if msg.tool_calls:
        data["tool_calls"] = [struct_to_dict(call) for call in msg.tool_calls]
    if msg.metadata.fields:
        data["metadata"] = struct_to_dict(msg.metadata)
    built.data.update(data)
    if msg.HasField("created_at"):
        built.time.CopyFrom(msg.created_at)
    if replace is not None:
        built.surface_op.replace.start_seq, built.surface_op.replace.stop_seq = replace
    return built


# -- messages -------------------------------------------------------------------------------------


def role_name(role: int) -> str:
    """``ROLE_ASSISTANT`` -> ``"assistant"`` (``"unspecified"`` for an unknown value)."""
    return _ROLE_NAMES.get(role, "unspecified")


def message_to_dict(message: Message, *, extra: bool = False) -> dict[str, Any]:
    """A derived Message in the OpenAI chat format, ready for a model API.

    With ``extra=True`` the dict also carries ``reasoning_content``, ``metadata`` and
    ``created_at`` (an aware datetime) when the message has them; chat APIs reject or ignore
    those, so they are left out by default.

    >>> message_to_dict(Message(role=Role.ROLE_USER, content="hi"))
    {'role': 'user', 'content': 'hi'}
    """
    out: dict[str, Any] = {"role": role_name(message.role)}
    metadata = struct_to_dict(message.metadata)
    if message.HasField("content"):
        out["content"] = message.content
    elif isinstance(metadata.get("content_parts"), list):
        out["content"] = metadata["content_parts"]
    else:
        out["content"] = None
    if message.tool_calls:
        out["tool_calls"] = [struct_to_dict(call) for call in message.tool_calls]
    for name in ("tool_call_id", "name"):
        if message.HasField(name):
            out[name] = getattr(message, name)
    if extra:
        if message.HasField("reasoning_content"):
            out["reasoning_content"] = message.reasoning_content
        if metadata:
            out["metadata"] = metadata
        if message.HasField("created_at"):
            out["created_at"] = message.created_at.ToDatetime(tzinfo=dt.UTC)
    return out


def message_from_dict(value: Mapping[str, Any]) -> Message:
    """A chat-format dict -> Message (for SeedSession, or :func:`event_from_message`).

    Reads role, content (string, None, or a list of parts), reasoning_content, tool_call_id,
    name, tool_calls, metadata and created_at; an unknown role gives ``ROLE_UNSPECIFIED``, which
    seeding drops and reports.

    >>> message_from_dict({"role": "tool", "tool_call_id": "c1", "content": "42"}).tool_call_id
    'c1'
    """
    role = value.get("role", "")
    msg = Message(role=_ROLES.get(str(role).lower(), Role.ROLE_UNSPECIFIED))
    metadata = dict(value.get("metadata") or {})
    content = value.get("content")
    if isinstance(content, list):
        metadata["content_parts"] = content
    elif content is not None:
        msg.content = str(content)
    for name in ("reasoning_content", "tool_call_id", "name"):
        if value.get(name) is not None:
            setattr(msg, name, str(value[name]))
    for call in value.get("tool_calls") or ():
        msg.tool_calls.add().update(dict(call))
    if metadata:
        msg.metadata.update(metadata)
    if value.get("created_at") is not None:
        msg.created_at.CopyFrom(_timestamp(value["created_at"]))
    return msg


def messages_to_dicts(messages: Iterable[Message], *, extra: bool = False) -> list[dict[str, Any]]:
    """Every message through :func:`message_to_dict`, in order."""
    return [message_to_dict(m, extra=extra) for m in messages]


def messages_from_dicts(values: Iterable[Mapping[str, Any] | Message]) -> list[Message]:
    """Every dict through :func:`message_from_dict` (Messages pass through), in order."""
    return [v if isinstance(v, Message) else message_from_dict(v) for v in values]


# -- values ---------------------------------------------------------------------------------------


WHOLE_LIMIT = 2**53
"""Whole doubles below this magnitude are ints in JSON-ready values; every integer up to it is
exactly representable as a double, and none beyond it is guaranteed to be."""


def struct_to_dict(value: Struct) -> dict[str, Any]:
    """A Struct as plain JSON values, whole numbers as ints (see :func:`whole_numbers`)."""
    if not value.fields:
        return {}
    plain: dict[str, Any] = whole_numbers(json_format.MessageToDict(value))
    return plain


def whole_numbers(value: Any) -> Any:
    """``value`` (nested dicts and lists of JSON values) with every float that holds a whole
    number of magnitude below 2^53 turned into an int: ``{"x": 1.0}`` -> ``{"x": 1}``.

    ``google.protobuf.Struct`` stores every number as a double, so ``{"x": 1}`` comes back as
    ``1.0``; this restores what was meant wherever a person or a script reads the value. Larger
    or fractional numbers stay floats.

    >>> whole_numbers({"tokens": 1834.0, "ratio": 0.5, "list": [2.0]})
    {'tokens': 1834, 'ratio': 0.5, 'list': [2]}
    """
    if isinstance(value, float) and value.is_integer() and abs(value) < WHOLE_LIMIT:
        return int(value)
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    return value


def message_to_json(message: ProtoMessage) -> dict[str, Any]:
    """Any sessionlog message as JSON-ready values, for scripts (the CLI's ``--json``).

    It differs from protobuf's JSON mapping where that mapping is awkward to script against:
    64-bit integers are numbers (not strings); enums are their short lower-case names (role
    ``"user"`` as in the chat format, type ``"user_message"`` as ``event()`` takes it, state
    ``"streaming"``); ``Struct`` values have whole numbers as ints (:func:`whole_numbers`);
    every field without presence is present, zero values included (the first seq is 0).
    Field names are the proto's; times and durations are protobuf's JSON strings; bytes are
    base64.
    """
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        if field.has_presence and not message.HasField(field.name):
            continue
        value = getattr(message, field.name)
        if _is_map(field):
            entry: Any = field.message_type
            value_field = entry.fields_by_name["value"]
            out[field.name] = {k: _json_field(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_json_field(field, v) for v in value]
        else:
            out[field.name] = _json_field(field, value)
    return out


_AS_JSON_STRING = {"google.protobuf.Timestamp", "google.protobuf.Duration"}
_AS_JSON_VALUE = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}


def _is_map(field: Any) -> bool:  # descriptors: the upb and Python classes differ
    kind = field.message_type
    return bool(field.is_repeated and kind is not None and kind.GetOptions().map_entry)


def _json_field(field: Any, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        name = field.message_type.full_name
        if name in _AS_JSON_STRING:
            return value.ToJsonString()
        if name in _AS_JSON_VALUE:
            return whole_numbers(json_format.MessageToDict(value))
        return message_to_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return enum_name(field.enum_type, value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    return value


def enum_name(enum: Any, number: int) -> str | int:
    """The short lower-case name of an enum value, its type's prefix dropped:
    ``ROLE_USER`` -> ``"user"``, ``REPLICATION_STATE_STREAMING`` -> ``"streaming"``. A number
    this client does not know (a newer server) stays a number."""
    known = enum.values_by_number.get(number)
    if known is None:
        return number
    prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"
    short: str = known.name.removeprefix(prefix).lower()
    return short


def _timestamp(value: TimeLike) -> Timestamp:
    stamp = Timestamp()
    if isinstance(value, Timestamp):
        stamp.CopyFrom(value)
    elif isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ValueError("a naive datetime is ambiguous; give it a tzinfo (e.g. UTC)")
        stamp.FromDatetime(value.astimezone(dt.UTC))
    else:
        stamp.FromJsonString(value)
    return stamp
