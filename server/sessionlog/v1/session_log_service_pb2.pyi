from sessionlog.v1 import event_pb2 as _event_pb2
from sessionlog.v1 import message_pb2 as _message_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AppendRequest(_message.Message):
    __slots__ = ("session_id", "events", "expected_seq", "request_id", "lease_holder", "lenient")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SEQ_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    LENIENT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    expected_seq: int
    request_id: str
    lease_holder: str
    lenient: bool
    def __init__(self, session_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., expected_seq: _Optional[int] = ..., request_id: _Optional[str] = ..., lease_holder: _Optional[str] = ..., lenient: _Optional[bool] = ...) -> None: ...

class AppendDrop(_message.Message):
    __slots__ = ("index", "reason", "message")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    index: int
    reason: str
    message: str
    def __init__(self, index: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("events", "next_seq", "drops")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    next_seq: int
    drops: _containers.RepeatedCompositeFieldContainer[AppendDrop]
    def __init__(self, events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., next_seq: _Optional[int] = ..., drops: _Optional[_Iterable[_Union[AppendDrop, _Mapping]]] = ...) -> None: ...

class SinceRequest(_message.Message):
    __slots__ = ("session_id", "seq", "follow")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seq: int
    follow: bool
    def __init__(self, session_id: _Optional[str] = ..., seq: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class SinceResponse(_message.Message):
    __slots__ = ("events", "caught_up", "next_seq")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    caught_up: bool
    next_seq: int
    def __init__(self, events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., caught_up: _Optional[bool] = ..., next_seq: _Optional[int] = ...) -> None: ...

class SurfaceRequest(_message.Message):
    __slots__ = ("session_id", "at_seq")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AT_SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    at_seq: int
    def __init__(self, session_id: _Optional[str] = ..., at_seq: _Optional[int] = ...) -> None: ...

class SurfaceResponse(_message.Message):
    __slots__ = ("events", "event_count", "replace_generation")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    REPLACE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    event_count: int
    replace_generation: int
    def __init__(self, events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., event_count: _Optional[int] = ..., replace_generation: _Optional[int] = ...) -> None: ...

class DeriveMessagesRequest(_message.Message):
    __slots__ = ("session_id", "at_seq")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AT_SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    at_seq: int
    def __init__(self, session_id: _Optional[str] = ..., at_seq: _Optional[int] = ...) -> None: ...

class DeriveMessagesResponse(_message.Message):
    __slots__ = ("messages", "seqs", "event_count", "replace_generation")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SEQS_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    REPLACE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_message_pb2.Message]
    seqs: _containers.RepeatedScalarFieldContainer[int]
    event_count: int
    replace_generation: int
    def __init__(self, messages: _Optional[_Iterable[_Union[_message_pb2.Message, _Mapping]]] = ..., seqs: _Optional[_Iterable[int]] = ..., event_count: _Optional[int] = ..., replace_generation: _Optional[int] = ...) -> None: ...
