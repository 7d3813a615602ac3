import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from sessionlog.v1 import event_pb2 as _event_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChangeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHANGE_KIND_UNSPECIFIED: _ClassVar[ChangeKind]
    CHANGE_KIND_APPEND: _ClassVar[ChangeKind]
    CHANGE_KIND_CREATE: _ClassVar[ChangeKind]
    CHANGE_KIND_FORK: _ClassVar[ChangeKind]
    CHANGE_KIND_LEASE: _ClassVar[ChangeKind]
    CHANGE_KIND_DELETE: _ClassVar[ChangeKind]
    CHANGE_KIND_REDACT: _ClassVar[ChangeKind]
    CHANGE_KIND_UPDATE: _ClassVar[ChangeKind]

class ClusterRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLUSTER_ROLE_UNSPECIFIED: _ClassVar[ClusterRole]
    CLUSTER_ROLE_LEADER: _ClassVar[ClusterRole]
    CLUSTER_ROLE_FOLLOWER: _ClassVar[ClusterRole]
    CLUSTER_ROLE_FENCED: _ClassVar[ClusterRole]

class AckMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_MODE_UNSPECIFIED: _ClassVar[AckMode]
    ACK_MODE_LOCAL: _ClassVar[AckMode]
    ACK_MODE_REPLICA: _ClassVar[AckMode]

class ReplicationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICATION_STATE_UNSPECIFIED: _ClassVar[ReplicationState]
    REPLICATION_STATE_PRIMARY: _ClassVar[ReplicationState]
    REPLICATION_STATE_DISCONNECTED: _ClassVar[ReplicationState]
    REPLICATION_STATE_CATCHING_UP: _ClassVar[ReplicationState]
    REPLICATION_STATE_STREAMING: _ClassVar[ReplicationState]
    REPLICATION_STATE_DIVERGED: _ClassVar[ReplicationState]
    REPLICATION_STATE_FENCED: _ClassVar[ReplicationState]
CHANGE_KIND_UNSPECIFIED: ChangeKind
CHANGE_KIND_APPEND: ChangeKind
CHANGE_KIND_CREATE: ChangeKind
CHANGE_KIND_FORK: ChangeKind
CHANGE_KIND_LEASE: ChangeKind
CHANGE_KIND_DELETE: ChangeKind
CHANGE_KIND_REDACT: ChangeKind
CHANGE_KIND_UPDATE: ChangeKind
CLUSTER_ROLE_UNSPECIFIED: ClusterRole
CLUSTER_ROLE_LEADER: ClusterRole
CLUSTER_ROLE_FOLLOWER: ClusterRole
CLUSTER_ROLE_FENCED: ClusterRole
ACK_MODE_UNSPECIFIED: AckMode
ACK_MODE_LOCAL: AckMode
ACK_MODE_REPLICA: AckMode
REPLICATION_STATE_UNSPECIFIED: ReplicationState
REPLICATION_STATE_PRIMARY: ReplicationState
REPLICATION_STATE_DISCONNECTED: ReplicationState
REPLICATION_STATE_CATCHING_UP: ReplicationState
REPLICATION_STATE_STREAMING: ReplicationState
REPLICATION_STATE_DIVERGED: ReplicationState
REPLICATION_STATE_FENCED: ReplicationState

class StorageDelete(_message.Message):
    __slots__ = ("table", "key", "end_key")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    END_KEY_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: bytes
    end_key: bytes
    def __init__(self, table: _Optional[str] = ..., key: _Optional[bytes] = ..., end_key: _Optional[bytes] = ...) -> None: ...

class StoragePut(_message.Message):
    __slots__ = ("table", "key", "value", "remove")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: bytes
    value: bytes
    remove: bool
    def __init__(self, table: _Optional[str] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., remove: _Optional[bool] = ...) -> None: ...

class Change(_message.Message):
    __slots__ = ("position", "kind", "session_id", "commit_time", "first_seq", "event_count", "internal_id", "puts", "events", "checksum", "epoch", "deletes", "erased", "erased_positions")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    PUTS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DELETES_FIELD_NUMBER: _ClassVar[int]
    ERASED_FIELD_NUMBER: _ClassVar[int]
    ERASED_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    position: int
    kind: ChangeKind
    session_id: str
    commit_time: _timestamp_pb2.Timestamp
    first_seq: int
    event_count: int
    internal_id: int
    puts: _containers.RepeatedCompositeFieldContainer[StoragePut]
    events: _containers.RepeatedCompositeFieldContainer[_event_pb2.Event]
    checksum: bytes
    epoch: int
    deletes: _containers.RepeatedCompositeFieldContainer[StorageDelete]
    erased: bool
    erased_positions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, position: _Optional[int] = ..., kind: _Optional[_Union[ChangeKind, str]] = ..., session_id: _Optional[str] = ..., commit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., first_seq: _Optional[int] = ..., event_count: _Optional[int] = ..., internal_id: _Optional[int] = ..., puts: _Optional[_Iterable[_Union[StoragePut, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[_event_pb2.Event, _Mapping]]] = ..., checksum: _Optional[bytes] = ..., epoch: _Optional[int] = ..., deletes: _Optional[_Iterable[_Union[StorageDelete, _Mapping]]] = ..., erased: _Optional[bool] = ..., erased_positions: _Optional[_Iterable[int]] = ...) -> None: ...

class ChangesRequest(_message.Message):
    __slots__ = ("start_position", "follow", "after_checksum", "heartbeat_interval", "epoch")
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    AFTER_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    start_position: int
    follow: bool
    after_checksum: bytes
    heartbeat_interval: _duration_pb2.Duration
    epoch: int
    def __init__(self, start_position: _Optional[int] = ..., follow: _Optional[bool] = ..., after_checksum: _Optional[bytes] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...

class ChangesResponse(_message.Message):
    __slots__ = ("changes", "caught_up", "head_position", "head_commit_time", "history_id", "epoch", "fenced_epoch", "new_primary")
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    HEAD_POSITION_FIELD_NUMBER: _ClassVar[int]
    HEAD_COMMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    HISTORY_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FENCED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEW_PRIMARY_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[Change]
    caught_up: bool
    head_position: int
    head_commit_time: _timestamp_pb2.Timestamp
    history_id: str
    epoch: int
    fenced_epoch: int
    new_primary: str
    def __init__(self, changes: _Optional[_Iterable[_Union[Change, _Mapping]]] = ..., caught_up: _Optional[bool] = ..., head_position: _Optional[int] = ..., head_commit_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., history_id: _Optional[str] = ..., epoch: _Optional[int] = ..., fenced_epoch: _Optional[int] = ..., new_primary: _Optional[str] = ...) -> None: ...

class EpochStart(_message.Message):
    __slots__ = ("epoch", "first_position")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FIRST_POSITION_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    first_position: int
    def __init__(self, epoch: _Optional[int] = ..., first_position: _Optional[int] = ...) -> None: ...

class GetReplicationStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetReplicationStatusResponse(_message.Message):
    __slots__ = ("role", "primary", "position", "primary_position", "lag_positions", "lag", "caught_up", "connected", "last_contact_time", "state", "history_id", "primary_history_id", "detail", "epoch", "epoch_history", "ack", "sync_replicas", "replicas", "cluster", "sync_set")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_POSITION_FIELD_NUMBER: _ClassVar[int]
    LAG_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_CONTACT_TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_ID_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_HISTORY_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_HISTORY_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    SYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    SYNC_SET_FIELD_NUMBER: _ClassVar[int]
    role: str
    primary: str
    position: int
    primary_position: int
    lag_positions: int
    lag: _duration_pb2.Duration
    caught_up: bool
    connected: bool
    last_contact_time: _timestamp_pb2.Timestamp
    state: ReplicationState
    history_id: str
    primary_history_id: str
    detail: str
    epoch: int
    epoch_history: _containers.RepeatedCompositeFieldContainer[EpochStart]
    ack: AckMode
    sync_replicas: int
    replicas: _containers.RepeatedCompositeFieldContainer[SyncReplica]
    cluster: ClusterStatus
    sync_set: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, role: _Optional[str] = ..., primary: _Optional[str] = ..., position: _Optional[int] = ..., primary_position: _Optional[int] = ..., lag_positions: _Optional[int] = ..., lag: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., caught_up: _Optional[bool] = ..., connected: _Optional[bool] = ..., last_contact_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[ReplicationState, str]] = ..., history_id: _Optional[str] = ..., primary_history_id: _Optional[str] = ..., detail: _Optional[str] = ..., epoch: _Optional[int] = ..., epoch_history: _Optional[_Iterable[_Union[EpochStart, _Mapping]]] = ..., ack: _Optional[_Union[AckMode, str]] = ..., sync_replicas: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[SyncReplica, _Mapping]]] = ..., cluster: _Optional[_Union[ClusterStatus, _Mapping]] = ..., sync_set: _Optional[_Iterable[str]] = ...) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("group", "member", "role", "leader", "epoch", "reason", "lease", "lease_remaining", "etcd_endpoint", "blocked_by", "deposed")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    LEASE_REMAINING_FIELD_NUMBER: _ClassVar[int]
    ETCD_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_BY_FIELD_NUMBER: _ClassVar[int]
    DEPOSED_FIELD_NUMBER: _ClassVar[int]
    group: str
    member: str
    role: ClusterRole
    leader: str
    epoch: int
    reason: str
    lease: int
    lease_remaining: _duration_pb2.Duration
    etcd_endpoint: str
    blocked_by: _containers.RepeatedScalarFieldContainer[str]
    deposed: str
    def __init__(self, group: _Optional[str] = ..., member: _Optional[str] = ..., role: _Optional[_Union[ClusterRole, str]] = ..., leader: _Optional[str] = ..., epoch: _Optional[int] = ..., reason: _Optional[str] = ..., lease: _Optional[int] = ..., lease_remaining: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., etcd_endpoint: _Optional[str] = ..., blocked_by: _Optional[_Iterable[str]] = ..., deposed: _Optional[str] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("replica", "position", "checksum", "epoch")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    replica: str
    position: int
    checksum: bytes
    epoch: int
    def __init__(self, replica: _Optional[str] = ..., position: _Optional[int] = ..., checksum: _Optional[bytes] = ..., epoch: _Optional[int] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SyncReplica(_message.Message):
    __slots__ = ("replica", "peer", "position", "connected", "counts", "report_time", "detail", "epoch")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    REPORT_TIME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    replica: str
    peer: str
    position: int
    connected: bool
    counts: bool
    report_time: _timestamp_pb2.Timestamp
    detail: str
    epoch: int
    def __init__(self, replica: _Optional[str] = ..., peer: _Optional[str] = ..., position: _Optional[int] = ..., connected: _Optional[bool] = ..., counts: _Optional[bool] = ..., report_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., detail: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...
