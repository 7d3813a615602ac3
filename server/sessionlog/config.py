"""Every setting of `sessionlog serve`, from flags, environment variables and a TOML file.

Precedence, highest first: a command-line flag, then its environment variable
(``SESSIONLOG_<NAME>``), then the TOML file (``--config FILE`` or ``SESSIONLOG_CONFIG``), then the
default. The file uses the flag names with underscores as top-level keys:

    data = "/var/lib/sessionlog"
    listen = "[::]:50051"
    map_size = "64GiB"
    max_events_per_append = 5000

Every value is validated at start; a bad one stops the server with one line naming the setting.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from sessionlog import fold, retention
from sessionlog.cluster import settings
from sessionlog.cluster.settings import ClusterSettings, cluster_settings
from sessionlog.defaults import (
    DEFAULT_APPEND_STREAM_WINDOW,
    DEFAULT_DATA_DIR,
    DEFAULT_FOLLOW_SEND_RATE,
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_LEASE_TTL_SECONDS,
    DEFAULT_LISTEN,
    DEFAULT_MAP_SIZE,
    DEFAULT_MAX_EVENTS_PER_APPEND,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_STREAMS,
    DEFAULT_MAX_STREAMS_PER_CONNECTION,
    DEFAULT_REPLICA_TIMEOUT_SECONDS,
    DEFAULT_REQUEST_ID_TTL_SECONDS,
    DEFAULT_RETENTION_SWEEP_INTERVAL_SECONDS,
    DEFAULT_SHUTDOWN_GRACE_SECONDS,
    DEFAULT_SYNC_TIMEOUT_SECONDS,
    DEFAULT_WORKERS,
    DURABILITY_MODES,
    MIN_HEARTBEAT_SECONDS,
    SYNC,
)
from sessionlog.defaults import ConfigError as ConfigError
from sessionlog.shard.ownership import from_file
from sessionlog.shard.shardmap import ShardMapError

_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(value: Any) -> int:
    """A byte count: plain bytes, or with a K/M/G/T suffix (KiB, MB... all mean powers of 1024)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"not a size: {value!r} (try 8GiB, 512MiB or a number of bytes)")
    unit = (match.group(2) or "").upper()[:1]
    return int(match.group(1)) * _UNITS[unit]


_GRPC_MAX_MESSAGE = (1 << 31) - 1
"""gRPC message lengths are 32-bit signed integers."""


def _positive_int(value: Any) -> int:
    # A fractional number (TOML 2.5) is refused, not truncated; a bool is not a number here.
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"must be a whole number of at least 1, not {value!r}")
    number = int(value)
    if number < 1:
        raise ValueError(f"must be a whole number of at least 1, not {value!r}")
    return number


_OFF_WORDS = ("forever", "off", "never")
_MINUTE, _HOUR, _DAY = 60.0, 3600.0, 86400.0
_UNITS_SHOWN: tuple[tuple[str, float], ...] = (("d", _DAY), ("h", _HOUR), ("m", _MINUTE), ("s", 1))


def _read_seconds(value: Any) -> float:
    """A duration as seconds: a number of seconds, or one with a unit ("500ms", "90s", "12h")."""
    return retention.parse_duration(value) / retention.NS


def _show_seconds(seconds: float) -> str:
    """A bound of a duration setting, for people: 0.3s, 1h, 30d."""
    for unit, scale in _UNITS_SHOWN:
        if seconds >= scale and seconds % scale == 0:
            return f"{seconds / scale:g}{unit}"
    return f"{seconds:g}s"


def _show_bytes(size: float) -> str:
    """A bound of a size setting, for people: 64KiB, 128TiB, 2GiB less one byte."""
    if int(size) % 1024 == 1023:
        return f"{_show_bytes(size + 1)} less one byte"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{int(size) // scale}{unit}"
    return f"{int(size)} bytes"


@dataclass(frozen=True)
class Bounded:
    """The one parser of every duration, size and count setting: ``read`` turns the text (or a
    TOML number) into seconds, bytes or a count, which must lie from ``least`` to ``most``, or be
    0 when ``off`` (the setting is then off; "forever", "off" and "never" say so too). Anything
    else, an absurd or non-finite value (1e9 seconds, inf, nan, a negative) included, is refused
    with one message naming the range; ``resolve`` adds the setting and where the value came
    from."""

    read: Callable[[Any], float]
    least: float
    most: float
    kind: str
    """What a value is, for the message: "duration", "size" or "whole number"."""
    show: Callable[[float], str]
    hint: str
    off: bool = False

    def __call__(self, value: Any) -> Any:
        if self.off and str(value).strip().lower() in _OFF_WORDS:
            return 0.0
        try:
            number = self.read(value)
        except (ValueError, OverflowError):
            number = math.nan
        if (self.off and number == 0) or self.least <= number <= self.most:
            return number
        raise ValueError(f"must be a {self.kind} from {self.range}, not {value!r} ({self.hint})")

    @property
    def range(self) -> str:
        """The values accepted, for people: "0.3s to 1h", "1s to 36500d or 0 (off)"."""
        span = f"{self.show(self.least)} to {self.show(self.most)}"
        return f"{span} or 0 (off)" if self.off else span


def _seconds(least: float, most: float, *, off: bool = False) -> Bounded:
    """A duration setting's parser: seconds from ``least`` to ``most`` (``Bounded``)."""
    hint = "a number of seconds, or with a unit: 500ms, 90s, 30m, 12h, 7d"
    return Bounded(_read_seconds, least, most, "duration", _show_seconds, hint, off)


def _whole(value: Any) -> int:
    """A whole number: an int, its text, or a float without a fraction (TOML 2.0); a bool, a
    fraction (2.5) or anything else is ValueError, never truncated."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"not a whole number: {value!r}")
    return int(value)


def _count(most: int) -> Bounded:
    """A count setting's parser: a whole number from 1 to ``most`` (``Bounded``)."""
    return Bounded(_whole, 1, most, "whole number", lambda n: f"{int(n):,}", "no fraction, no unit")


def _bytes(least: int, most: int) -> Bounded:
    """A size setting's parser: bytes from ``least`` to ``most`` (``Bounded``)."""
    hint = "a number of bytes, or with a unit: 64KiB, 512MiB, 8GiB"
    return Bounded(parse_size, least, most, "size", _show_bytes, hint)


def _workers(value: Any) -> str | int:
    """``auto`` (one per usable CPU) or a whole number of processes, 1 to MAX_WORKERS."""
    if value == "auto":
        return "auto"
    try:
        number = _positive_int(value)
    except ValueError:
        raise ValueError(
            f"must be auto or a whole number from 1 to {MAX_WORKERS}, not {value!r}"
        ) from None
    if number > MAX_WORKERS:
        raise ValueError(f"must be auto or a whole number from 1 to {MAX_WORKERS}, not {value!r}")
    return number


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be text, not {value!r}")
    return value


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"must be true or false, not {value!r}")


def _cluster_setting(name: str) -> Callable[[Any], Any]:
    """The parser of a cluster setting, ``cluster.settings.parse_NAME``, which says what is wrong
    with a value; ``--cluster`` keeps its text (the endpoints are parsed again where used)."""

    def parse(value: Any) -> Any:
        parsed = getattr(settings, f"parse_{name}")(value)
        return value.strip() if name == "cluster" else parsed

    return parse


def _choice(*options: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}, not {value!r}")
        return str(value)

    return parse


@dataclass(frozen=True)
class Setting:
    """One setting: its name (flag --name-with-dashes, env SESSIONLOG_NAME, TOML key name), how
    its text is parsed, and how the parsed value becomes its ServerConfig field (``to_field``;
    with ``part``, the attribute of that field's nested config it sets) and back again
    (``from_field``, for ``flags_of``)."""

    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    metavar: str | None = None
    flag_only_switch: bool = False
    secret: bool = False
    to_field: Callable[[Any], Any] = lambda value: value
    from_field: Callable[[Any], Any] = lambda value: value
    part: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "SESSIONLOG_" + self.name.upper()


_SETTINGS_KEY = "settings"


def _setting(
    name: str,
    parse: Callable[[Any], Any],
    default: Any,
    help: str,
    metavar: str | None = None,
    **options: Any,
) -> Any:
    """A ServerConfig field declared by its one setting: the field's default is the setting's
    default as ``to_field`` turns it into the field's value."""
    setting = Setting(name, parse, default, help, metavar, **options)
    return field(default=setting.to_field(default), metadata={_SETTINGS_KEY: (setting,)})


SHARD_MAP_ETCD = "etcd"
"""``--shard-map etcd``: the map is read from the cluster's etcd (any other value is a file)."""
MAX_WORKERS = 256
REPLICA_TIMEOUT_FLOOR_SECONDS = 0.3
"""Three times the shortest heartbeat a server sends (``MIN_HEARTBEAT_SECONDS``)."""


@dataclass(frozen=True)
class ServerConfig:
    """Everything `sessionlog serve` can be told; the defaults are the embedded set-up.

    Each field is declared once, by the setting (or, for ``limits``, the settings) that fill it:
    the flags, environment variables, TOML keys, ``--print-config`` and the docs' settings table all
    come from these declarations (``SETTINGS``), in this order.
    """

    data_dir: str = _setting(
        "data",
        _text,
        DEFAULT_DATA_DIR,
        "folder holding the LMDB environment; created if missing",
        "DIR",
    )
    listen: str = _setting(
        "listen",
        _text,
        DEFAULT_LISTEN,
        "gRPC address HOST:PORT ([::]:PORT for every interface)",
        "HOST:PORT",
    )
    workers: int = _setting(
        "workers",
        _workers,
        DEFAULT_WORKERS,
        "server processes sharing the port and the data folder: auto (one per usable CPU) or a "
        "number; 1 runs everything in one process. A replica, --ack replica and a --cluster "
        "member run one",
        "N",
        to_field=lambda value: 0 if value == "auto" else value,
        from_field=lambda count: count or "auto",
    )
    """Worker processes (0: one per usable CPU; see ``worker_count``)."""
    metrics_listen: str = _setting(
        "metrics_listen",
        _text,
        "",
        "serve Prometheus metrics at http://HOST:PORT/metrics (no auth: keep it internal)",
        "HOST:PORT",
    )
    http_listen: str = _setting(
        "http_listen",
        _text,
        "",
        "serve the read-only web console at http://HOST:PORT/ (same tokens as gRPC when "
        "auth is on)",
        "HOST:PORT",
    )
    map_size: int = _setting(
        "map_size",
        _bytes(1 << 20, 128 << 40),
        DEFAULT_MAP_SIZE,
        "largest size the data file may reach (e.g. 8GiB); a full map answers STORAGE_FULL: "
        "raise it and restart",
        "SIZE",
    )
    durability: str = _setting(
        "durability",
        _choice(*DURABILITY_MODES),
        SYNC,
        "when an append is acknowledged. sync: once its commit is on disk (two syncs per "
        "commit). group: the same guarantee, the commit's meta page synced by the next group's "
        "commit (or one sync when no group follows): fewer syncs under load, a group's replies "
        "wait for that sync. nosync: at once; a machine crash may lose recently acknowledged "
        "appends (a process crash loses none)",
        "MODE",
    )
    max_message_bytes: int = _setting(
        "max_message_size",
        _bytes(64 << 10, _GRPC_MAX_MESSAGE),
        DEFAULT_MAX_MESSAGE_BYTES,
        "largest gRPC request, and largest unary reply; clients must accept replies this "
        "large too (gRPC's default is 4MiB)",
        "SIZE",
    )
    """Largest gRPC message accepted or sent (an Append's reply echoes its events)."""
    limits: fold.Limits = field(
        default=fold.DEFAULT_LIMITS,
        metadata={
            _SETTINGS_KEY: (
                Setting(
                    "max_event_size",
                    _bytes(1 << 10, 1 << 30),
                    fold.DEFAULT_LIMITS.max_event_bytes,
                    "largest serialized event (EVENT_TOO_LARGE above it)",
                    "SIZE",
                    part="max_event_bytes",
                ),
                Setting(
                    "max_data_depth",
                    _count(100),
                    fold.DEFAULT_LIMITS.max_data_depth,
                    "deepest nesting of objects and lists in event data; data itself is level 1",
                    "N",
                    part="max_data_depth",
                ),
            )
        },
    )
    max_events_per_append: int = _setting(
        "max_events_per_append",
        _count(1_000_000),
        DEFAULT_MAX_EVENTS_PER_APPEND,
        "most events in one Append, CreateSession or SeedSession (TOO_MANY_EVENTS)",
        "N",
    )
    append_stream_window: int = _setting(
        "append_stream_window",
        _count(100_000),
        DEFAULT_APPEND_STREAM_WINDOW,
        "most requests of one AppendStream in flight (read, not yet answered); past it the "
        "server stops reading that stream until replies go out",
        "N",
    )
    max_streams: int = _setting(
        "max_streams",
        _count(1_000_000),
        DEFAULT_MAX_STREAMS,
        "most open Since/Changes/AppendStream streams in total (TOO_MANY_STREAMS)",
        "N",
    )
    max_streams_per_connection: int = _setting(
        "max_streams_per_connection",
        _count(1_000_000),
        DEFAULT_MAX_STREAMS_PER_CONNECTION,
        "most open Since/Changes/AppendStream streams on one connection",
        "N",
    )
    heartbeat_seconds: float = _setting(
        "heartbeat",
        _seconds(MIN_HEARTBEAT_SECONDS, _HOUR),
        DEFAULT_HEARTBEAT_SECONDS,
        "seconds between heartbeats on an idle follow stream",
        "SECONDS",
    )
    follow_send_rate: int = _setting(
        "follow_send_rate",
        _count(10_000_000),
        DEFAULT_FOLLOW_SEND_RATE,
        "live follow-stream responses per second the server aims to stay under in total: with "
        "many followers, each stream gets at most one response per followers/rate seconds, "
        "holding more events",
        "N",
    )
    shutdown_grace_seconds: float = _setting(
        "shutdown_grace",
        _seconds(0, _HOUR),
        DEFAULT_SHUTDOWN_GRACE_SECONDS,
        "seconds in-flight calls get to finish on SIGTERM",
        "SECONDS",
    )
    retention_idle_seconds: float = _setting(
        "retention_idle",
        _seconds(1, 36500 * _DAY, off=True),
        0.0,
        "delete unpinned sessions whose last append or update is older than this (such as 90d); "
        "0 or forever (the default): keep them",
        "DURATION",
    )
    retention_sweep_interval_seconds: float = _setting(
        "retention_sweep_interval",
        _seconds(0.1, 7 * _DAY),
        DEFAULT_RETENTION_SWEEP_INTERVAL_SECONDS,
        "how often the retention sweeper deletes expired sessions (and idle ones, with "
        "--retention-idle)",
        "DURATION",
    )
    request_id_ttl_seconds: int = _setting(
        "request_id_ttl",
        _seconds(0, 30 * _DAY),
        float(DEFAULT_REQUEST_ID_TTL_SECONDS),
        "seconds a request_id is remembered for idempotent retries",
        "SECONDS",
        to_field=int,
    )
    replica_of: str = _setting(
        "replica_of",
        _text,
        "",
        "run as a read replica that follows this primary; writes are refused with NOT_PRIMARY",
        "HOST:PORT",
    )
    ack: str = _setting(
        "ack",
        _choice("local", "replica"),
        "local",
        "when a write is acknowledged. local: once committed and synced here (a failover may "
        "lose it). replica: once --sync-replicas replicas also hold it durably; with fewer, "
        "writes fail UNAVAILABLE / REPLICAS_UNAVAILABLE after --sync-timeout (committed here). "
        "Runs one process (--workers 1)",
        "MODE",
    )
    sync_replicas: int = _setting(
        "sync_replicas",
        _count(100),
        1,
        "with --ack replica: how many replicas must hold a write before it is acknowledged "
        "(a --cluster leader: every member of its synchronous set, at least K; see High "
        "availability)",
        "K",
    )
    sync_timeout_seconds: float = _setting(
        "sync_timeout",
        _seconds(0.01, _HOUR),
        DEFAULT_SYNC_TIMEOUT_SECONDS,
        "with --ack replica: seconds a write waits for its replicas before it fails "
        "REPLICAS_UNAVAILABLE",
        "SECONDS",
    )
    cluster: str = _setting(
        "cluster",
        _cluster_setting("cluster"),
        "",
        "join a group whose primary etcd elects: etcd://HOST:PORT[,HOST:PORT...]. The member "
        "that wins leads (takes writes, epochs from etcd), the others replicate it; needs "
        "--group and --advertise, excludes --replica-of, runs one process (--workers 1)",
        "etcd://HOST:PORT",
    )
    group: str = _setting(
        "group",
        _cluster_setting("group"),
        "",
        "with --cluster: the group's name (its etcd keys are under /sessionlog/groups/NAME/); "
        "with --shard-map: this server's group in the map",
        "NAME",
    )
    advertise: str = _setting(
        "advertise",
        _cluster_setting("advertise"),
        "",
        "with --cluster: HOST:PORT where the other members and the clients reach this server; "
        "with --shard-map: the member address that names this server's group",
        "HOST:PORT",
    )
    lease_ttl: int = _setting(
        "lease_ttl",
        _cluster_setting("lease_ttl"),
        DEFAULT_LEASE_TTL_SECONDS,
        "with --cluster: seconds (2 to 600) of the member's etcd lease; a leader that cannot "
        "renew it stops taking writes after half of it, and another member can take over once "
        "it has run out",
        "SECONDS",
    )
    shard_map: str = _setting(
        "shard_map",
        _text,
        "",
        "serve only the sessions the shard map gives this server's group: a TOML FILE (static "
        "groups), or etcd (with --cluster: the map under /sessionlog/shards, polled every "
        "second). The group is --group, else the one listing --advertise or --listen; calls for "
        "another group's sessions fail WRONG_GROUP. Empty: this server owns every session",
        "FILE|etcd",
    )
    replica_timeout_seconds: float = _setting(
        "replica_timeout",
        _seconds(REPLICA_TIMEOUT_FLOOR_SECONDS, _HOUR),
        DEFAULT_REPLICA_TIMEOUT_SECONDS,
        "seconds a replica waits for any frame from its primary (it asks for heartbeats at a "
        "third of this) before it deems the link dead, shows connected false and reconnects",
        "SECONDS",
    )
    replica_token: str = _setting(
        "replica_token",
        _text,
        "",
        "bearer token the replica presents to its primary (admin permission); visible in "
        "`ps`: prefer --replica-token-file",
        "TOKEN",
        secret=True,
    )
    replica_token_file: str = _setting(
        "replica_token_file",
        _text,
        "",
        "file holding the replica's bearer token (surrounding whitespace stripped)",
        "FILE",
    )
    replica_serve_open: bool = _setting(
        "replica_serve_open",
        _boolean,
        False,
        "let a replica that presents a token to its primary serve without --auth-tokens of its "
        "own, i.e. every tenant's data to anyone who can reach it",
        flag_only_switch=True,
    )
    replica_tls_ca: str = _setting(
        "replica_tls_ca",
        _text,
        "",
        "PEM CA to verify a TLS primary with (connects over TLS when set)",
        "FILE",
    )
    replica_tls_cert: str = _setting(
        "replica_tls_cert",
        _text,
        "",
        "PEM client certificate for a primary that requires mTLS",
        "FILE",
    )
    replica_tls_key: str = _setting(
        "replica_tls_key", _text, "", "PEM key of --replica-tls-cert", "FILE"
    )
    tls_cert: str = _setting(
        "tls_cert", _text, "", "PEM certificate chain: serve TLS only (with --tls-key)", "FILE"
    )
    tls_key: str = _setting("tls_key", _text, "", "PEM private key of --tls-cert", "FILE")
    tls_client_ca: str = _setting(
        "tls_client_ca",
        _text,
        "",
        "PEM CA bundle: require client certificates signed by it (mTLS)",
        "FILE",
    )
    auth_tokens: str = _setting(
        "auth_tokens",
        _text,
        "",
        "TOML tokens file: require a bearer token on every call (docs: Operations, Security)",
        "FILE",
    )
    auth_open_health: bool = _setting(
        "auth_open_health",
        _boolean,
        False,
        "with auth on, let health checks and reflection through without a token",
        flag_only_switch=True,
    )
    log_level: str = _setting(
        "log_level",
        _choice("debug", "info", "warning", "error"),
        "info",
        "least severe log level printed",
        "LEVEL",
    )
    log_format: str = _setting(
        "log_format",
        _choice("auto", "json", "text"),
        "auto",
        "auto: JSON lines when stderr is not a terminal, readable text when it is",
        "FORMAT",
    )

    def __post_init__(self) -> None:
        floor = self.limits.max_event_bytes + 4096
        if self.max_message_bytes < floor:
            raise ConfigError(
                f"max message size {self.max_message_bytes} is too small for the event size limit "
                f"{self.limits.max_event_bytes}: it must be at least {floor} bytes"
            )
        if self.heartbeat_seconds <= 0 or self.shutdown_grace_seconds < 0:
            raise ConfigError("heartbeat must be positive and shutdown grace not negative")
        if self.replica_timeout_seconds < REPLICA_TIMEOUT_FLOOR_SECONDS:
            raise ConfigError(
                f"--replica-timeout must be at least {REPLICA_TIMEOUT_FLOOR_SECONDS} seconds "
                "(it asks the primary for heartbeats at a third of it)"
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key")
        if bool(self.replica_tls_cert) != bool(self.replica_tls_key):
            raise ConfigError("--replica-tls-cert and --replica-tls-key go together")
        self._check_replica_auth()
        self._check_ack()
        self._check_cluster()
        self._check_shard_map()
        if self.replica_of and self.workers > 1:
            raise ConfigError(
                f"a replica runs in one process: workers is {self.workers}; set it to 1 or auto "
                "(--workers, SESSIONLOG_WORKERS or the file's workers) when --replica-of is set"
            )
        for name in (
            "max_events_per_append",
            "append_stream_window",
            "max_streams",
            "max_streams_per_connection",
            "follow_send_rate",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1")
        for name in ("metrics_listen", "http_listen"):
            _check_address(name, getattr(self, name))

    def _check_ack(self) -> None:
        if self.ack != "replica":
            if self.sync_replicas > 1:
                raise ConfigError(
                    f"--sync-replicas {self.sync_replicas} needs --ack replica (with --ack local "
                    "no write waits for replicas)"
                )
            return
        if self.workers > 1:
            raise ConfigError(
                f"--ack replica runs in one process: workers is {self.workers}; set it to 1 or "
                "auto (auto means 1 with --ack replica). A write's reply waits for replica "
                "reports that reach one process only"
            )

    def _check_cluster(self) -> None:
        if self.cluster_settings is None:
            return
        if self.replica_of:
            raise ConfigError(
                f"--cluster and --replica-of {self.replica_of} exclude each other: in a group, "
                "etcd elects the primary and every other member replicates it; drop --replica-of"
            )
        if self.workers > 1:
            raise ConfigError(
                f"a cluster member runs in one process: workers is {self.workers}; set it to 1 "
                "or auto (--workers, SESSIONLOG_WORKERS or the file's workers) when --cluster is "
                "set. Its etcd lease, which decides whether it may write, lives in one process"
            )

    @property
    def cluster_settings(self) -> ClusterSettings | None:
        """The group this server is a member of (None without --cluster); ConfigError when
        the four settings do not go together."""
        if not self.cluster and self.shard_map:  # --group and --advertise name the map's group
            return cluster_settings(lease_ttl=self.lease_ttl)
        return cluster_settings(self.cluster, self.group, self.advertise, self.lease_ttl)

    def _check_shard_map(self) -> None:
        if self.shard_map == SHARD_MAP_ETCD and not self.cluster:
            raise ConfigError(
                "--shard-map etcd reads the map from the cluster's etcd: it needs --cluster "
                "etcd://HOST:PORT (or give --shard-map a TOML file)"
            )
        if self.shard_map != SHARD_MAP_ETCD and self.cluster and self.shard_map:
            raise ConfigError(
                f"--shard-map {self.shard_map}: a --cluster member reads its map from etcd; "
                "use --shard-map etcd (and `sessionlog cluster map put FILE`)"
            )
        if self.cluster or not self.shard_map:
            return
        for name, parse in (
            ("group", settings.parse_group),
            ("advertise", settings.parse_advertise),
        ):
            try:
                parse(getattr(self, name))
            except ValueError as exc:
                raise ConfigError(f"--{name}: {exc}") from None
        try:  # a file that will not do stops the server here, before any worker starts
            from_file(self.shard_map, self.group, self.advertise or self.listen)
        except ShardMapError as exc:
            raise ConfigError(f"--shard-map: {exc}") from None

    @property
    def required_replicas(self) -> int:
        """How many replicas must hold a write before it is acknowledged (0: --ack local)."""
        return self.sync_replicas if self.ack == "replica" else 0

    def _check_replica_auth(self) -> None:
        """A replica that needs a token to read its primary holds a primary's data behind
        tokens: serving it to anyone must be asked for, not fallen into."""
        if self.replica_token and self.replica_token_file:
            raise ConfigError(
                "--replica-token and --replica-token-file both give the replica's token; keep one "
                "(the file keeps the secret out of `ps`)"
            )
        if self.replica_of and self.replica_token_file:
            replica_token_of(self)  # a missing or empty file is the first thing to hear about
        has_token = bool(self.replica_token or self.replica_token_file)
        if self.replica_of and has_token and not self.auth_tokens and not self.replica_serve_open:
            raise ConfigError(
                "this replica presents a token to its primary but has no --auth-tokens of its "
                "own, so it would serve every tenant's data to anyone: give it --auth-tokens "
                "FILE, or --replica-serve-open to serve open on purpose"
            )

    @property
    def serves_open_replica(self) -> bool:
        """A replica of a primary that requires tokens, serving with none (on purpose)."""
        has_token = bool(self.replica_token or self.replica_token_file)
        return bool(self.replica_of) and has_token and not self.auth_tokens


def _check_address(name: str, address: str) -> None:
    """An HTTP listen address must be HOST:PORT (or [IPv6]:PORT); empty means off."""
    if not address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(
            f"--{name.replace('_', '-')} {address!r} is not HOST:PORT (e.g. 127.0.0.1:9090)"
        )


SETTINGS: tuple[Setting, ...] = tuple(
    setting for f in fields(ServerConfig) for setting in f.metadata[_SETTINGS_KEY]
)
"""Every setting, in the order of ServerConfig's fields (of --help and of the docs' table)."""
BY_NAME = {setting.name: setting for setting in SETTINGS}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Every setting as a flag whose default is None, so that an absent flag is visible."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file of settings (keys: the flag names with underscores) "
        "[env SESSIONLOG_CONFIG]",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration, each value with where it came from, and exit",
    )
    for setting in SETTINGS:
        shown = "off" if setting.default in ("", False) else setting.default
        bounds = f"; range {setting.parse.range}" if isinstance(setting.parse, Bounded) else ""
        help_text = f"{setting.help} [env {setting.env}; default {shown}{bounds}]"
        if setting.flag_only_switch:
            parser.add_argument(setting.flag, dest=setting.name, action="store_const", const=True)
            parser._actions[-1].help = help_text
        else:
            parser.add_argument(
                setting.flag, dest=setting.name, metavar=setting.metavar, help=help_text
            )


@dataclass(frozen=True)
class Resolved:
    """The effective settings and where each came from (flag, env, file, default)."""

    values: dict[str, Any]
    sources: dict[str, str]
    file: str


def resolve(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Resolved:
    """Apply the precedence; raise ConfigError naming the setting and source of a bad value."""
    env = os.environ if environ is None else environ
    file = args.config or env.get("SESSIONLOG_CONFIG", "")
    table = _load_file(file) if file else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        flag_value = getattr(args, setting.name, None)
        if flag_value is not None:
            raw, source = flag_value, f"flag {setting.flag}"
        elif setting.env in env:
            raw, source = env[setting.env], f"env {setting.env}"
        elif setting.name in table:
            raw, source = table[setting.name], f"file {file}"
        else:
            values[setting.name], sources[setting.name] = setting.default, "default"
            continue
        try:
            values[setting.name] = setting.parse(raw)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{setting.name} from {source}: {exc}") from None
        sources[setting.name] = source
    return Resolved(values, sources, file)


def _load_file(path: str) -> dict[str, Any]:
    try:
        table = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the config file {path!r} is not valid TOML: {exc}") from None
    unknown = sorted(set(table) - set(BY_NAME))
    if unknown:
        raise ConfigError(f"the config file {path!r} has unknown settings: {', '.join(unknown)}")
    return table


def server_config(resolved: Resolved) -> ServerConfig:
    """The ServerConfig the settings describe (validated by ServerConfig itself)."""
    values: dict[str, Any] = {}
    for config_field in fields(ServerConfig):
        parts: dict[str, Any] = {}
        for setting in config_field.metadata[_SETTINGS_KEY]:
            value = setting.to_field(resolved.values[setting.name])
            if setting.part:
                parts[setting.part] = value
            else:
                values[config_field.name] = value
        if parts:
            nested = getattr(ServerConfig, config_field.name)  # the field's default
            values[config_field.name] = replace(nested, **parts)
    return ServerConfig(**values)


def flags_of(config: ServerConfig) -> list[str]:
    """The `sessionlog serve` flags that make ``config``: one for each setting whose value is
    not its default (``sessionlog.testing`` starts server processes with them)."""
    flags: list[str] = []
    default = ServerConfig()
    for config_field in fields(ServerConfig):
        for setting in config_field.metadata[_SETTINGS_KEY]:
            value, usual = getattr(config, config_field.name), getattr(default, config_field.name)
            if setting.part:
                value, usual = getattr(value, setting.part), getattr(usual, setting.part)
            if value == usual:
                continue
            if setting.flag_only_switch:
                flags.append(setting.flag)
            else:
                flags += [setting.flag, str(setting.from_field(value))]
    return flags


def render(resolved: Resolved) -> str:
    """The effective configuration as TOML, with each value's source; secrets masked."""
    lines = ["# effective sessionlog configuration (precedence: flag > env > file > default)"]
    for setting in SETTINGS:
        value = resolved.values[setting.name]
        if setting.secret and value:
            value = "***"
        lines.append(f"{setting.name} = {_toml(value)}  # {resolved.sources[setting.name]}")
    return "\n".join(lines)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def markdown_table() -> str:
    """The settings as the docs' table (``make gen-docs`` writes it; a test keeps it true)."""
    rows = ["| flag | env / file key | default | meaning |", "| --- | --- | --- | --- |"]
    for setting in SETTINGS:
        flag = setting.flag + ("" if setting.flag_only_switch else f" {setting.metavar}")
        default = setting.default
        bounded = setting.parse if isinstance(setting.parse, Bounded) else None
        if isinstance(default, int) and bounded is not None and bounded.kind == "size":
            default = _human_size(default)
        shown = "(off)" if default in ("", False) else f"`{default}`"
        meaning = setting.help.replace("|", "\\|")
        if bounded is not None:
            meaning += f"; range {bounded.range}"
        rows.append(f"| `{flag}` | `{setting.env}` / `{setting.name}` | {shown} | {meaning} |")
    return "\n".join(rows)


def _human_size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


BEGIN_MARK = "<!-- settings:begin"
END_MARK = "<!-- settings:end -->"


def page_with_table(page: str) -> str:
    """A page's text (the docs' configuration page) with its generated settings table, between
    the settings markers, replaced by the current one."""
    start = page.index(BEGIN_MARK)
    start = page.index("\n", start) + 1
    end = page.index(END_MARK)
    return page[:start] + markdown_table() + "\n" + page[end:]


def worker_count(config: ServerConfig) -> int:
    """How many processes serve: the setting, or one per CPU this process may run on (``auto``);
    always one for a replica (its one replication stream applies in one process), with
    --ack replica (replica reports reach one process) and for a cluster member (its lease is
    one process's)."""
    if config.replica_of or config.ack == "replica" or config.cluster:
        return 1
    if config.workers:
        return config.workers
    return max(1, len(os.sched_getaffinity(0)))


def replica_token_of(config: ServerConfig) -> str:
    """The token the replica presents: the setting, or the stripped content of its file."""
    if not config.replica_token_file:
        return config.replica_token
    path = config.replica_token_file
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read the replica token file {path!r}: {reason}") from None
    if not token:
        raise ConfigError(f"the replica token file {path!r} is empty; write the token into it")
    if not (token.isascii() and token.isprintable()):
        raise ConfigError(
            f"the replica token file {path!r} must hold just the token: one line of printable "
            "ASCII (a header cannot carry anything else)"
        )
    return token


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--write-table"]:
        target = Path(sys.argv[2])
        target.write_text(page_with_table(target.read_text()))
    elif sys.argv[1:2] == ["--check-table"]:
        target = Path(sys.argv[2])
        if page_with_table(target.read_text()) != target.read_text():
            sys.exit(f"stale: the settings table of {target}; run make gen-docs")
        print(f"the settings table of {target} is up to date")
    else:
        print(markdown_table())
