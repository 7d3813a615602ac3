import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sessionlog.v1 import session_log_service_pb2 as _session_log_service_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EraseSessionsRequest(_message.Message):
    __slots__ = ("prefix", "filter", "reason", "slot_copies")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SLOT_COPIES_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    filter: str
    reason: str
    slot_copies: int
    def __init__(self, prefix: _Optional[str] = ..., filter: _Optional[str] = ..., reason: _Optional[str] = ..., slot_copies: _Optional[int] = ...) -> None: ...

class EraseSessionsResponse(_message.Message):
    __slots__ = ("session_count", "event_count", "position")
    SESSION_COUNT_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    session_count: int
    event_count: int
    position: int
    def __init__(self, session_count: _Optional[int] = ..., event_count: _Optional[int] = ..., position: _Optional[int] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("data_dir", "session_count", "event_count", "position", "last_commit_time", "map_size", "used_bytes", "file_bytes", "readers", "history_id", "history_start", "role", "map_epoch", "shard_group", "owned_slots")
    DATA_DIR_FIELD_NUMBER: _ClassVar[int]
    SESSION_COUNT_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    LAST_COMMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    MAP_SIZE_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_ID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_START_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SHARD_GROUP_FIELD_NUMBER: _ClassVar[int]
    OWNED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    data_dir: str
    session_count: int
    event_count: int
    position: int
    last_commit_time: _timestamp_pb2.Timestamp
    map_size: int
    used_bytes: int
    file_bytes: int
    readers: int
    history_id: str
    history_start: int
    role: str
    map_epoch: int
    shard_group: str
    owned_slots: int
    def __init__(self, data_dir: _Optional[str] = ..., session_count: _Optional[int] = ..., event_count: _Optional[int] = ..., position: _Optional[int] = ..., last_commit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., map_size: _Optional[int] = ..., used_bytes: _Optional[int] = ..., file_bytes: _Optional[int] = ..., readers: _Optional[int] = ..., history_id: _Optional[str] = ..., history_start: _Optional[int] = ..., role: _Optional[str] = ..., map_epoch: _Optional[int] = ..., shard_group: _Optional[str] = ..., owned_slots: _Optional[int] = ...) -> None: ...

class SaveSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SaveSnapshotResponse(_message.Message):
    __slots__ = ("info", "chunk", "sha256")
    INFO_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    info: SnapshotInfo
    chunk: bytes
    sha256: bytes
    def __init__(self, info: _Optional[_Union[SnapshotInfo, _Mapping]] = ..., chunk: _Optional[bytes] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class SnapshotInfo(_message.Message):
    __slots__ = ("size_bytes", "session_count", "event_count", "position", "last_commit_time", "map_size", "history_id")
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSION_COUNT_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    LAST_COMMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    MAP_SIZE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_ID_FIELD_NUMBER: _ClassVar[int]
    size_bytes: int
    session_count: int
    event_count: int
    position: int
    last_commit_time: _timestamp_pb2.Timestamp
    map_size: int
    history_id: str
    def __init__(self, size_bytes: _Optional[int] = ..., session_count: _Optional[int] = ..., event_count: _Optional[int] = ..., position: _Optional[int] = ..., last_commit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., map_size: _Optional[int] = ..., history_id: _Optional[str] = ...) -> None: ...

class PromoteRequest(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class PromoteResponse(_message.Message):
    __slots__ = ("epoch", "first_position", "history_id", "previous_primary")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_POSITION_FIELD_NUMBER: _ClassVar[int]
    HISTORY_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_PRIMARY_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    first_position: int
    history_id: str
    previous_primary: str
    def __init__(self, epoch: _Optional[int] = ..., first_position: _Optional[int] = ..., history_id: _Optional[str] = ..., previous_primary: _Optional[str] = ...) -> None: ...

class FenceRequest(_message.Message):
    __slots__ = ("epoch", "primary")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    primary: str
    def __init__(self, epoch: _Optional[int] = ..., primary: _Optional[str] = ...) -> None: ...

class FenceResponse(_message.Message):
    __slots__ = ("epoch", "stopped_writes")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STOPPED_WRITES_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    stopped_writes: bool
    def __init__(self, epoch: _Optional[int] = ..., stopped_writes: _Optional[bool] = ...) -> None: ...

class ListLeaseAuditRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "prefix")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    prefix: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., prefix: _Optional[str] = ...) -> None: ...

class ListLeaseAuditResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[SessionLeaseAuditEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[SessionLeaseAuditEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SessionLeaseAuditEntry(_message.Message):
    __slots__ = ("session_id", "entry", "index")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    entry: _session_log_service_pb2.LeaseAuditEntry
    index: int
    def __init__(self, session_id: _Optional[str] = ..., entry: _Optional[_Union[_session_log_service_pb2.LeaseAuditEntry, _Mapping]] = ..., index: _Optional[int] = ...) -> None: ...
