import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_TYPE_UNSPECIFIED: _ClassVar[EventType]
    EVENT_TYPE_SYSTEM_MESSAGE: _ClassVar[EventType]
    EVENT_TYPE_USER_MESSAGE: _ClassVar[EventType]
    EVENT_TYPE_ASSISTANT_MESSAGE: _ClassVar[EventType]
    EVENT_TYPE_TOOL_RESULT: _ClassVar[EventType]
    EVENT_TYPE_TOOL_CALL: _ClassVar[EventType]
    EVENT_TYPE_TURN_START: _ClassVar[EventType]
    EVENT_TYPE_TURN_END: _ClassVar[EventType]
    EVENT_TYPE_STEP_START: _ClassVar[EventType]
    EVENT_TYPE_STEP_END: _ClassVar[EventType]
    EVENT_TYPE_REQUEST_HEADER: _ClassVar[EventType]
    EVENT_TYPE_HIDE: _ClassVar[EventType]
EVENT_TYPE_UNSPECIFIED: EventType
EVENT_TYPE_SYSTEM_MESSAGE: EventType
EVENT_TYPE_USER_MESSAGE: EventType
EVENT_TYPE_ASSISTANT_MESSAGE: EventType
EVENT_TYPE_TOOL_RESULT: EventType
EVENT_TYPE_TOOL_CALL: EventType
EVENT_TYPE_TURN_START: EventType
EVENT_TYPE_TURN_END: EventType
EVENT_TYPE_STEP_START: EventType
EVENT_TYPE_STEP_END: EventType
EVENT_TYPE_REQUEST_HEADER: EventType
EVENT_TYPE_HIDE: EventType

class SurfaceOp(_message.Message):
    __slots__ = ("append", "replace")
    class Append(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    class Replace(_message.Message):
        __slots__ = ("start_seq", "stop_seq")
        START_SEQ_FIELD_NUMBER: _ClassVar[int]
        STOP_SEQ_FIELD_NUMBER: _ClassVar[int]
        start_seq: int
        stop_seq: int
        def __init__(self, start_seq: _Optional[int] = ..., stop_seq: _Optional[int] = ...) -> None: ...
    APPEND_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    append: SurfaceOp.Append
    replace: SurfaceOp.Replace
    def __init__(self, append: _Optional[_Union[SurfaceOp.Append, _Mapping]] = ..., replace: _Optional[_Union[SurfaceOp.Replace, _Mapping]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "type", "time", "data", "surface_op", "usage", "state_delta", "redacted")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SURFACE_OP_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_DELTA_FIELD_NUMBER: _ClassVar[int]
    REDACTED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    type: EventType
    time: _timestamp_pb2.Timestamp
    data: _struct_pb2.Struct
    surface_op: SurfaceOp
    usage: Usage
    state_delta: _struct_pb2.Struct
    redacted: Redaction
    def __init__(self, seq: _Optional[int] = ..., type: _Optional[_Union[EventType, str]] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., data: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., surface_op: _Optional[_Union[SurfaceOp, _Mapping]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., state_delta: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., redacted: _Optional[_Union[Redaction, _Mapping]] = ...) -> None: ...

class Redaction(_message.Message):
    __slots__ = ("redact_time", "reason")
    REDACT_TIME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    redact_time: _timestamp_pb2.Timestamp
    reason: str
    def __init__(self, redact_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("model", "input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    reasoning_tokens: int
    def __init__(self, model: _Optional[str] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., cached_input_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ...) -> None: ...
