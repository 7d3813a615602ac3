import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sessionlog.v1 import event_pb2 as _event_pb2
from sessionlog.v1 import message_pb2 as _message_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_VIEW_UNSPECIFIED: _ClassVar[SessionView]
    SESSION_VIEW_BASIC: _ClassVar[SessionView]
    SESSION_VIEW_FULL: _ClassVar[SessionView]

class LeaseAuditKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_AUDIT_KIND_UNSPECIFIED: _ClassVar[LeaseAuditKind]
    LEASE_AUDIT_KIND_TAKEOVER: _ClassVar[LeaseAuditKind]
    LEASE_AUDIT_KIND_FORCED_RELEASE: _ClassVar[LeaseAuditKind]
SESSION_VIEW_UNSPECIFIED: SessionView
SESSION_VIEW_BASIC: SessionView
SESSION_VIEW_FULL: SessionView
LEASE_AUDIT_KIND_UNSPECIFIED: LeaseAuditKind
LEASE_AUDIT_KIND_TAKEOVER: LeaseAuditKind
LEASE_AUDIT_KIND_FORCED_RELEASE: LeaseAuditKind

class AppendRequest(_message.Message):
    __slots__ = ("session_id", "events", "expected_seq", "request_id", "lease_holder", "lenient", "lease_token", "title", "expected_uid")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SEQ_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    LENIENT_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_UID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    expected_seq: int
    request_id: str
    lease_holder: str
    lenient: bool
    lease_token: int
    title: str
    expected_uid: str
    def __init__(self, session_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., expected_seq: _Optional[int] = ..., request_id: _Optional[str] = ..., lease_holder: _Optional[str] = ..., lenient: _Optional[bool] = ..., lease_token: _Optional[int] = ..., title: _Optional[str] = ..., expected_uid: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("events", "next_seq", "drops", "session_uid")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    SESSION_UID_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    next_seq: int
    drops: _containers.RepeatedCompositeFieldContainer[AppendDrop]
    session_uid: str
    def __init__(self, events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., next_seq: _Optional[int] = ..., drops: _Optional[_Iterable[_Union[AppendDrop, _Mapping]]] = ..., session_uid: _Optional[str] = ...) -> None: ...

class AppendStreamRequest(_message.Message):
    __slots__ = ("append", "correlation_id")
    APPEND_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    append: AppendRequest
    correlation_id: int
    def __init__(self, append: _Optional[_Union[AppendRequest, _Mapping]] = ..., correlation_id: _Optional[int] = ...) -> None: ...

class AppendStreamResponse(_message.Message):
    __slots__ = ("correlation_id", "append", "error")
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    correlation_id: int
    append: AppendResponse
    error: AppendStreamError
    def __init__(self, correlation_id: _Optional[int] = ..., append: _Optional[_Union[AppendResponse, _Mapping]] = ..., error: _Optional[_Union[AppendStreamError, _Mapping]] = ...) -> None: ...

class AppendStreamError(_message.Message):
    __slots__ = ("code", "message", "reason", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    reason: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SinceRequest(_message.Message):
    __slots__ = ("session_id", "seq", "follow", "heartbeat_interval")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seq: int
    follow: bool
    heartbeat_interval: _duration_pb2.Duration
    def __init__(self, session_id: _Optional[str] = ..., seq: _Optional[int] = ..., follow: _Optional[bool] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SinceResponse(_message.Message):
    __slots__ = ("events", "caught_up", "next_seq")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    caught_up: bool
    next_seq: int
    def __init__(self, events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., caught_up: _Optional[bool] = ..., next_seq: _Optional[int] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("session_id", "page_size", "page_token", "order_by")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ORDER_BY_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    page_size: int
    page_token: str
    order_by: str
    def __init__(self, session_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., order_by: _Optional[str] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token", "event_count", "session_uid")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    SESSION_UID_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    next_page_token: str
    event_count: int
    session_uid: str
    def __init__(self, events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., event_count: _Optional[int] = ..., session_uid: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("session_id", "at_seq", "known_event_count", "known_replace_generation", "page_size", "page_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AT_SEQ_FIELD_NUMBER: _ClassVar[int]
    KNOWN_EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    KNOWN_REPLACE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    at_seq: int
    known_event_count: int
    known_replace_generation: int
    page_size: int
    page_token: str
    def __init__(self, session_id: _Optional[str] = ..., at_seq: _Optional[int] = ..., known_event_count: _Optional[int] = ..., known_replace_generation: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class DeriveMessagesResponse(_message.Message):
    __slots__ = ("messages", "seqs", "event_count", "replace_generation", "incremental", "next_page_token")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SEQS_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    REPLACE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    INCREMENTAL_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_message_pb2.Message]
    seqs: _containers.RepeatedScalarFieldContainer[int]
    event_count: int
    replace_generation: int
    incremental: bool
    next_page_token: str
    def __init__(self, messages: _Optional[_Iterable[_Union[_message_pb2.Message, _Mapping]]] = ..., seqs: _Optional[_Iterable[int]] = ..., event_count: _Optional[int] = ..., replace_generation: _Optional[int] = ..., incremental: _Optional[bool] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ("session_id", "at_seq")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AT_SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    at_seq: int
    def __init__(self, session_id: _Optional[str] = ..., at_seq: _Optional[int] = ...) -> None: ...

class GetStateResponse(_message.Message):
    __slots__ = ("state", "event_count")
    STATE_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    state: _struct_pb2.Struct
    event_count: int
    def __init__(self, state: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., event_count: _Optional[int] = ...) -> None: ...

class GetUsageRequest(_message.Message):
    __slots__ = ("session_id", "at_seq", "include_descendants")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AT_SEQ_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DESCENDANTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    at_seq: int
    include_descendants: bool
    def __init__(self, session_id: _Optional[str] = ..., at_seq: _Optional[int] = ..., include_descendants: _Optional[bool] = ...) -> None: ...

class GetUsageResponse(_message.Message):
    __slots__ = ("usage", "event_count", "own_usage", "descendant_session_ids")
    USAGE_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    OWN_USAGE_FIELD_NUMBER: _ClassVar[int]
    DESCENDANT_SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    usage: _containers.RepeatedCompositeFieldContainer[ModelUsage]
    event_count: int
    own_usage: _containers.RepeatedCompositeFieldContainer[ModelUsage]
    descendant_session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, usage: _Optional[_Iterable[_Union[ModelUsage, _Mapping]]] = ..., event_count: _Optional[int] = ..., own_usage: _Optional[_Iterable[_Union[ModelUsage, _Mapping]]] = ..., descendant_session_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelUsage(_message.Message):
    __slots__ = ("model", "input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens", "event_count")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    model: str
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    reasoning_tokens: int
    event_count: int
    def __init__(self, model: _Optional[str] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., cached_input_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ..., event_count: _Optional[int] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("session_id", "exists", "event_count", "replace_generation", "create_time", "last_append_time", "parent_session_id", "parent_event_count", "lease", "title", "labels", "owner", "status", "update_time", "parent_seq", "expire_time", "ttl", "pinned", "uid", "usage", "state")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    REPLACE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_APPEND_TIME_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    PARENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    exists: bool
    event_count: int
    replace_generation: int
    create_time: _timestamp_pb2.Timestamp
    last_append_time: _timestamp_pb2.Timestamp
    parent_session_id: str
    parent_event_count: int
    lease: Lease
    title: str
    labels: _containers.ScalarMap[str, str]
    owner: str
    status: str
    update_time: _timestamp_pb2.Timestamp
    parent_seq: int
    expire_time: _timestamp_pb2.Timestamp
    ttl: _duration_pb2.Duration
    pinned: bool
    uid: str
    usage: _containers.RepeatedCompositeFieldContainer[ModelUsage]
    state: _struct_pb2.Struct
    def __init__(self, session_id: _Optional[str] = ..., exists: _Optional[bool] = ..., event_count: _Optional[int] = ..., replace_generation: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_append_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., parent_session_id: _Optional[str] = ..., parent_event_count: _Optional[int] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., title: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., owner: _Optional[str] = ..., status: _Optional[str] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., parent_seq: _Optional[int] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., pinned: _Optional[bool] = ..., uid: _Optional[str] = ..., usage: _Optional[_Iterable[_Union[ModelUsage, _Mapping]]] = ..., state: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("holder", "token", "acquire_time", "expire_time")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    holder: str
    token: int
    acquire_time: _timestamp_pb2.Timestamp
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, holder: _Optional[str] = ..., token: _Optional[int] = ..., acquire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LeaseAuditEntry(_message.Message):
    __slots__ = ("kind", "actor", "previous_holder", "previous_token", "time")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_HOLDER_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    kind: LeaseAuditKind
    actor: str
    previous_holder: str
    previous_token: int
    time: _timestamp_pb2.Timestamp
    def __init__(self, kind: _Optional[_Union[LeaseAuditKind, str]] = ..., actor: _Optional[str] = ..., previous_holder: _Optional[str] = ..., previous_token: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("session_id", "events", "lease_holder", "lease_token", "request_id", "title", "labels", "owner", "status", "parent_session_id", "parent_seq", "expire_time", "ttl", "pinned")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    lease_holder: str
    lease_token: int
    request_id: str
    title: str
    labels: _containers.ScalarMap[str, str]
    owner: str
    status: str
    parent_session_id: str
    parent_seq: int
    expire_time: _timestamp_pb2.Timestamp
    ttl: _duration_pb2.Duration
    pinned: bool
    def __init__(self, session_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., lease_holder: _Optional[str] = ..., lease_token: _Optional[int] = ..., request_id: _Optional[str] = ..., title: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., owner: _Optional[str] = ..., status: _Optional[str] = ..., parent_session_id: _Optional[str] = ..., parent_seq: _Optional[int] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., pinned: _Optional[bool] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session", "events")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    session: Session
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ...) -> None: ...

class SeedSessionRequest(_message.Message):
    __slots__ = ("session_id", "messages", "lease_holder", "lease_token", "request_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    messages: _containers.RepeatedCompositeFieldContainer[_message_pb2.Message]
    lease_holder: str
    lease_token: int
    request_id: str
    def __init__(self, session_id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_message_pb2.Message, _Mapping]]] = ..., lease_holder: _Optional[str] = ..., lease_token: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class SeedDrop(_message.Message):
    __slots__ = ("index", "reason")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    reason: str
    def __init__(self, index: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class SeedSessionResponse(_message.Message):
    __slots__ = ("session", "events", "drops")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    session: Session
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    drops: _containers.RepeatedCompositeFieldContainer[SeedDrop]
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., drops: _Optional[_Iterable[_Union[SeedDrop, _Mapping]]] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session", "lease_audit")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_AUDIT_FIELD_NUMBER: _ClassVar[int]
    session: Session
    lease_audit: _containers.RepeatedCompositeFieldContainer[LeaseAuditEntry]
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., lease_audit: _Optional[_Iterable[_Union[LeaseAuditEntry, _Mapping]]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "prefix", "filter", "order_by", "view")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    ORDER_BY_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    prefix: str
    filter: str
    order_by: str
    view: SessionView
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., prefix: _Optional[str] = ..., filter: _Optional[str] = ..., order_by: _Optional[str] = ..., view: _Optional[_Union[SessionView, str]] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token", "usage_total")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    USAGE_TOTAL_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[Session]
    next_page_token: str
    usage_total: _containers.RepeatedCompositeFieldContainer[ModelUsage]
    def __init__(self, sessions: _Optional[_Iterable[_Union[Session, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., usage_total: _Optional[_Iterable[_Union[ModelUsage, _Mapping]]] = ...) -> None: ...

class UpdateSessionRequest(_message.Message):
    __slots__ = ("session", "update_mask")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    session: Session
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class UpdateSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class GetShardMapRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetShardMapResponse(_message.Message):
    __slots__ = ("shard_map", "group")
    SHARD_MAP_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    shard_map: ShardMap
    group: str
    def __init__(self, shard_map: _Optional[_Union[ShardMap, _Mapping]] = ..., group: _Optional[str] = ...) -> None: ...

class ShardMap(_message.Message):
    __slots__ = ("epoch", "groups")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    groups: _containers.RepeatedCompositeFieldContainer[ShardGroup]
    def __init__(self, epoch: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[ShardGroup, _Mapping]]] = ...) -> None: ...

class ShardGroup(_message.Message):
    __slots__ = ("name", "members", "slot_ranges", "primary")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SLOT_RANGES_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    name: str
    members: _containers.RepeatedScalarFieldContainer[str]
    slot_ranges: _containers.RepeatedCompositeFieldContainer[SlotRange]
    primary: str
    def __init__(self, name: _Optional[str] = ..., members: _Optional[_Iterable[str]] = ..., slot_ranges: _Optional[_Iterable[_Union[SlotRange, _Mapping]]] = ..., primary: _Optional[str] = ...) -> None: ...

class SlotRange(_message.Message):
    __slots__ = ("first", "last")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class ForkSessionRequest(_message.Message):
    __slots__ = ("parent_session_id", "at_seq", "session_id", "lease_holder", "lease_token", "request_id")
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AT_SEQ_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    parent_session_id: str
    at_seq: int
    session_id: str
    lease_holder: str
    lease_token: int
    request_id: str
    def __init__(self, parent_session_id: _Optional[str] = ..., at_seq: _Optional[int] = ..., session_id: _Optional[str] = ..., lease_holder: _Optional[str] = ..., lease_token: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ForkSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class DeleteSessionRequest(_message.Message):
    __slots__ = ("session_id", "expected_seq", "lease_holder", "force", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SEQ_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    expected_seq: int
    lease_holder: str
    force: bool
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., expected_seq: _Optional[int] = ..., lease_holder: _Optional[str] = ..., force: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class DeleteSessionResponse(_message.Message):
    __slots__ = ("session", "event_count", "position")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    session: Session
    event_count: int
    position: int
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., event_count: _Optional[int] = ..., position: _Optional[int] = ...) -> None: ...

class RedactEventsRequest(_message.Message):
    __slots__ = ("session_id", "seqs", "reason", "lease_holder")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seqs: _containers.RepeatedScalarFieldContainer[int]
    reason: str
    lease_holder: str
    def __init__(self, session_id: _Optional[str] = ..., seqs: _Optional[_Iterable[int]] = ..., reason: _Optional[str] = ..., lease_holder: _Optional[str] = ...) -> None: ...

class RedactEventsResponse(_message.Message):
    __slots__ = ("seqs", "position")
    SEQS_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    seqs: _containers.RepeatedScalarFieldContainer[int]
    position: int
    def __init__(self, seqs: _Optional[_Iterable[int]] = ..., position: _Optional[int] = ...) -> None: ...

class AcquireLeaseRequest(_message.Message):
    __slots__ = ("session_id", "holder", "ttl")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    holder: str
    ttl: _duration_pb2.Duration
    def __init__(self, session_id: _Optional[str] = ..., holder: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class AcquireLeaseResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("session_id", "holder", "ttl")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    holder: str
    ttl: _duration_pb2.Duration
    def __init__(self, session_id: _Optional[str] = ..., holder: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RenewLeaseResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class ReleaseLeaseRequest(_message.Message):
    __slots__ = ("session_id", "holder", "force")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    holder: str
    force: bool
    def __init__(self, session_id: _Optional[str] = ..., holder: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class ReleaseLeaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: Lease
    def __init__(self, released: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class ImportSessionRequest(_message.Message):
    __slots__ = ("session_id", "first_seq", "events", "create_time", "last_append_time", "parent_session_id", "parent_event_count", "request_records", "lease", "lease_audit", "record")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_APPEND_TIME_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    LEASE_AUDIT_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    first_seq: int
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    create_time: _timestamp_pb2.Timestamp
    last_append_time: _timestamp_pb2.Timestamp
    parent_session_id: str
    parent_event_count: int
    request_records: _containers.RepeatedCompositeFieldContainer[SessionRequestRecord]
    lease: SessionLeaseRecord
    lease_audit: _containers.RepeatedCompositeFieldContainer[LeaseAuditEntry]
    record: Session
    def __init__(self, session_id: _Optional[str] = ..., first_seq: _Optional[int] = ..., events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_append_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., parent_session_id: _Optional[str] = ..., parent_event_count: _Optional[int] = ..., request_records: _Optional[_Iterable[_Union[SessionRequestRecord, _Mapping]]] = ..., lease: _Optional[_Union[SessionLeaseRecord, _Mapping]] = ..., lease_audit: _Optional[_Iterable[_Union[LeaseAuditEntry, _Mapping]]] = ..., record: _Optional[_Union[Session, _Mapping]] = ...) -> None: ...

class ImportSessionResponse(_message.Message):
    __slots__ = ("session", "imported_count")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    IMPORTED_COUNT_FIELD_NUMBER: _ClassVar[int]
    session: Session
    imported_count: int
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., imported_count: _Optional[int] = ...) -> None: ...

class SessionRequestRecord(_message.Message):
    __slots__ = ("request_id", "fingerprint", "first_seq", "event_count", "next_seq", "drops", "time", "child_session_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    CHILD_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    fingerprint: str
    first_seq: int
    event_count: int
    next_seq: int
    drops: _containers.RepeatedCompositeFieldContainer[AppendDrop]
    time: _timestamp_pb2.Timestamp
    child_session_id: str
    def __init__(self, request_id: _Optional[str] = ..., fingerprint: _Optional[str] = ..., first_seq: _Optional[int] = ..., event_count: _Optional[int] = ..., next_seq: _Optional[int] = ..., drops: _Optional[_Iterable[_Union[AppendDrop, _Mapping]]] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., child_session_id: _Optional[str] = ...) -> None: ...

class SessionLeaseRecord(_message.Message):
    __slots__ = ("lease", "former_holders")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    FORMER_HOLDERS_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    former_holders: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., former_holders: _Optional[_Iterable[str]] = ...) -> None: ...

class GetSessionRecordsRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetSessionRecordsResponse(_message.Message):
    __slots__ = ("session", "request_records", "lease", "lease_audit")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    LEASE_AUDIT_FIELD_NUMBER: _ClassVar[int]
    session: Session
    request_records: _containers.RepeatedCompositeFieldContainer[SessionRequestRecord]
    lease: SessionLeaseRecord
    lease_audit: _containers.RepeatedCompositeFieldContainer[LeaseAuditEntry]
    def __init__(self, session: _Optional[_Union[Session, _Mapping]] = ..., request_records: _Optional[_Iterable[_Union[SessionRequestRecord, _Mapping]]] = ..., lease: _Optional[_Union[SessionLeaseRecord, _Mapping]] = ..., lease_audit: _Optional[_Iterable[_Union[LeaseAuditEntry, _Mapping]]] = ...) -> None: ...

class FollowSessionsRequest(_message.Message):
    __slots__ = ("prefix", "filter", "after_position", "from_start", "heartbeat_interval", "after_checksum")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    AFTER_POSITION_FIELD_NUMBER: _ClassVar[int]
    FROM_START_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    AFTER_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    filter: str
    after_position: int
    from_start: bool
    heartbeat_interval: _duration_pb2.Duration
    after_checksum: bytes
    def __init__(self, prefix: _Optional[str] = ..., filter: _Optional[str] = ..., after_position: _Optional[int] = ..., from_start: _Optional[bool] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., after_checksum: _Optional[bytes] = ...) -> None: ...

class FollowSessionsResponse(_message.Message):
    __slots__ = ("changes", "position", "caught_up", "heartbeat", "position_checksum")
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    POSITION_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[FollowedChange]
    position: int
    caught_up: bool
    heartbeat: bool
    position_checksum: bytes
    def __init__(self, changes: _Optional[_Iterable[_Union[FollowedChange, _Mapping]]] = ..., position: _Optional[int] = ..., caught_up: _Optional[bool] = ..., heartbeat: _Optional[bool] = ..., position_checksum: _Optional[bytes] = ...) -> None: ...

class FollowedChange(_message.Message):
    __slots__ = ("session_id", "position", "events", "deleted")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    position: int
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    deleted: bool
    def __init__(self, session_id: _Optional[str] = ..., position: _Optional[int] = ..., events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., deleted: _Optional[bool] = ...) -> None: ...
