"""The defaults of `sessionlog serve`'s settings, and the error a configuration that contradicts
itself raises: a leaf (it imports nothing of sessionlog), so every layer may take them from here.

``config`` declares each setting with its default from here; a module that needs a default
without the settings (storage, cluster, shard, service) imports it from here, never from
``config``, which sits above them (it reads the cluster and shard settings with their parsers).
"""

from __future__ import annotations

DEFAULT_DATA_DIR = "./sessionlog-data"
DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_MAP_SIZE = 8 << 30
DEFAULT_REQUEST_ID_TTL_SECONDS = 24 * 3600
DEFAULT_MAX_MESSAGE_BYTES = 4 << 20
"""gRPC clients accept 4 MiB replies by default; a larger limit needs clients told so too."""
DEFAULT_MAX_EVENTS_PER_APPEND = 10_000
DEFAULT_APPEND_STREAM_WINDOW = 256
"""Requests of one AppendStream read and not yet answered; past it the server stops reading."""
DEFAULT_MAX_STREAMS = 10_000
DEFAULT_MAX_STREAMS_PER_CONNECTION = 1_000
DEFAULT_HEARTBEAT_SECONDS = 15.0
MIN_HEARTBEAT_SECONDS = 0.1
"""The shortest heartbeat a follow stream gets, and the least --heartbeat takes."""
DEFAULT_FOLLOW_SEND_RATE = 5_000
"""Live follow responses per second, all streams together, that one server paces itself to:
about what one Python process sends while leaving time for appends (see ``StreamLimiter.pace``)."""
DEFAULT_SHUTDOWN_GRACE_SECONDS = 10.0
DEFAULT_RETENTION_SWEEP_INTERVAL_SECONDS = 60.0
DEFAULT_REPLICA_TIMEOUT_SECONDS = 5.0
DEFAULT_SYNC_TIMEOUT_SECONDS = 5.0
DEFAULT_LEASE_TTL_SECONDS = 5
"""A cluster member's etcd lease (--lease-ttl): a leader that cannot renew it stops writing
after half of it, and a new one can be elected once it has run out."""
DEFAULT_WORKERS = "auto"
SYNC = "sync"
"""--durability sync: a commit syncs its data pages, then its meta page; replies follow both."""
GROUP = "group"
"""--durability group: a commit syncs its data pages only; its meta page is synced by the next
commit's data sync (or one explicit sync when no commit follows), and its replies wait for that."""
NOSYNC = "nosync"
"""--durability nosync: no syncs; a machine crash may lose acknowledged writes."""
DURABILITY_MODES = (SYNC, GROUP, NOSYNC)


class ConfigError(ValueError):
    """The configuration contradicts itself; the message says which values to change."""
