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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionlog import fold
from sessionlog.service.app import DEFAULT_DATA_DIR, DEFAULT_LISTEN, ConfigError, ServerConfig
from sessionlog.service.limits import (
    DEFAULT_FOLLOW_SEND_RATE,
    DEFAULT_MAX_EVENTS_PER_APPEND,
    DEFAULT_MAX_STREAMS,
    DEFAULT_MAX_STREAMS_PER_CONNECTION,
)
from sessionlog.service.replication import DEFAULT_REPLICA_TIMEOUT_SECONDS
from sessionlog.storage.store import DEFAULT_MAP_SIZE, DEFAULT_REQUEST_ID_TTL_SECONDS

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


def _message_size(value: Any) -> int:
    size = parse_size(value)
    if size > _GRPC_MAX_MESSAGE:
        raise ValueError(f"must be below 2GiB (gRPC's largest message), not {value!r}")
    return size


def _positive_int(value: Any) -> int:
    # A fractional number (TOML 2.5) is refused, not truncated; a bool is not a number here.
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"must be a whole number of at least 1, not {value!r}")
    number = int(value)
    if number < 1:
        raise ValueError(f"must be a whole number of at least 1, not {value!r}")
    return number


def _seconds(value: Any) -> float:
    number = float(value)
    if isinstance(value, bool) or not math.isfinite(number) or number < 0:
        raise ValueError(f"must be a finite, non-negative number of seconds, not {value!r}")
    return number


def _positive_seconds(value: Any) -> float:
    number = _seconds(value)
    if number == 0:
        raise ValueError(f"must be a number of seconds above 0, not {value!r}")
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


def _choice(*options: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}, not {value!r}")
        return str(value)

    return parse


@dataclass(frozen=True)
class Setting:
    """One setting: its name (flag --name-with-dashes, env SESSIONLOG_NAME, TOML key name)."""

    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    metavar: str | None = None
    flag_only_switch: bool = False
    secret: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "SESSIONLOG_" + self.name.upper()


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "data",
        _text,
        DEFAULT_DATA_DIR,
        "folder holding the LMDB environment; created if missing",
        "DIR",
    ),
    Setting(
        "listen",
        _text,
        DEFAULT_LISTEN,
        "gRPC address HOST:PORT ([::]:PORT for every interface)",
        "HOST:PORT",
    ),
    Setting(
        "metrics_listen",
        _text,
        "",
        "serve Prometheus metrics at http://HOST:PORT/metrics (no auth: keep it internal)",
        "HOST:PORT",
    ),
    Setting(
        "http_listen",
        _text,
        "",
        "serve the read-only web console at http://HOST:PORT/ (same tokens as gRPC when "
        "auth is on)",
        "HOST:PORT",
    ),
    Setting(
        "map_size",
        parse_size,
        DEFAULT_MAP_SIZE,
        "largest size the data file may reach (e.g. 8GiB); a full map answers STORAGE_FULL: "
        "raise it and restart",
        "SIZE",
    ),
    Setting(
        "durability",
        _choice("sync", "nosync"),
        "sync",
        "sync: acknowledge an append only once it is on disk. nosync: faster, but a machine "
        "crash may lose recently acknowledged appends",
        "MODE",
    ),
    Setting(
        "max_message_size",
        _message_size,
        4 << 20,
        "largest gRPC request, and largest unary reply; clients must accept replies this "
        "large too (gRPC's default is 4MiB)",
        "SIZE",
    ),
    Setting(
        "max_event_size",
        parse_size,
        1 << 20,
        "largest serialized event (EVENT_TOO_LARGE above it)",
        "SIZE",
    ),
    Setting(
        "max_data_depth",
        _positive_int,
        24,
        "deepest nesting of objects and lists in event data; data itself is level 1",
        "N",
    ),
    Setting(
        "max_events_per_append",
        _positive_int,
        DEFAULT_MAX_EVENTS_PER_APPEND,
        "most events in one Append, CreateSession or SeedSession (TOO_MANY_EVENTS)",
        "N",
    ),
    Setting(
        "max_streams",
        _positive_int,
        DEFAULT_MAX_STREAMS,
        "most open Since/Changes streams in total (TOO_MANY_STREAMS)",
        "N",
    ),
    Setting(
        "max_streams_per_connection",
        _positive_int,
        DEFAULT_MAX_STREAMS_PER_CONNECTION,
        "most open Since/Changes streams on one connection",
        "N",
    ),
    Setting(
        "heartbeat",
        _positive_seconds,
        15.0,
        "seconds between heartbeats on an idle follow stream",
        "SECONDS",
    ),
    Setting(
        "follow_send_rate",
        _positive_int,
        DEFAULT_FOLLOW_SEND_RATE,
        "live follow-stream responses per second the server aims to stay under in total: with "
        "many followers, each stream gets at most one response per followers/rate seconds, "
        "holding more events",
        "N",
    ),
    Setting(
        "shutdown_grace",
        _seconds,
        10.0,
        "seconds in-flight calls get to finish on SIGTERM",
        "SECONDS",
    ),
    Setting(
        "request_id_ttl",
        _seconds,
        float(DEFAULT_REQUEST_ID_TTL_SECONDS),
        "seconds a request_id is remembered for idempotent retries",
        "SECONDS",
    ),
    Setting(
        "replica_of",
        _text,
        "",
        "run as a read replica that follows this primary; writes are refused with NOT_PRIMARY",
        "HOST:PORT",
    ),
    Setting(
        "replica_timeout",
        _positive_seconds,
        DEFAULT_REPLICA_TIMEOUT_SECONDS,
        "seconds a replica waits for any frame from its primary (it asks for heartbeats at a "
        "third of this) before it deems the link dead, shows connected false and reconnects",
        "SECONDS",
    ),
    Setting(
        "replica_token",
        _text,
        "",
        "bearer token the replica presents to its primary (admin permission); visible in "
        "`ps`: prefer --replica-token-file",
        "TOKEN",
        secret=True,
    ),
    Setting(
        "replica_token_file",
        _text,
        "",
        "file holding the replica's bearer token (surrounding whitespace stripped)",
        "FILE",
    ),
    Setting(
        "replica_serve_open",
        _boolean,
        False,
        "let a replica that presents a token to its primary serve without --auth-tokens of its "
        "own, i.e. every tenant's data to anyone who can reach it",
        flag_only_switch=True,
    ),
    Setting(
        "replica_tls_ca",
        _text,
        "",
        "PEM CA to verify a TLS primary with (connects over TLS when set)",
        "FILE",
    ),
    Setting(
        "replica_tls_cert",
        _text,
        "",
        "PEM client certificate for a primary that requires mTLS",
        "FILE",
    ),
    Setting("replica_tls_key", _text, "", "PEM key of --replica-tls-cert", "FILE"),
    Setting(
        "tls_cert", _text, "", "PEM certificate chain: serve TLS only (with --tls-key)", "FILE"
    ),
    Setting("tls_key", _text, "", "PEM private key of --tls-cert", "FILE"),
    Setting(
        "tls_client_ca",
        _text,
        "",
        "PEM CA bundle: require client certificates signed by it (mTLS)",
        "FILE",
    ),
    Setting(
        "auth_tokens",
        _text,
        "",
        "TOML tokens file: require a bearer token on every call (see README)",
        "FILE",
    ),
    Setting(
        "auth_open_health",
        _boolean,
        False,
        "with auth on, let health checks and reflection through without a token",
        flag_only_switch=True,
    ),
    Setting(
        "log_level",
        _choice("debug", "info", "warning", "error"),
        "info",
        "least severe log level printed",
        "LEVEL",
    ),
    Setting(
        "log_format",
        _choice("auto", "json", "text"),
        "auto",
        "auto: JSON lines when stderr is not a terminal, readable text when it is",
        "FORMAT",
    ),
)
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
        help_text = f"{setting.help} [env {setting.env}; default {shown}]"
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
    v = resolved.values
    return ServerConfig(
        data_dir=v["data"],
        listen=v["listen"],
        map_size=v["map_size"],
        durable=v["durability"] == "sync",
        limits=fold.Limits(max_event_bytes=v["max_event_size"], max_data_depth=v["max_data_depth"]),
        max_message_bytes=v["max_message_size"],
        max_events_per_append=v["max_events_per_append"],
        max_streams=v["max_streams"],
        max_streams_per_connection=v["max_streams_per_connection"],
        heartbeat_seconds=v["heartbeat"],
        follow_send_rate=v["follow_send_rate"],
        shutdown_grace_seconds=v["shutdown_grace"],
        request_id_ttl_seconds=int(v["request_id_ttl"]),
        replica_of=v["replica_of"],
        replica_timeout_seconds=v["replica_timeout"],
        replica_token=v["replica_token"],
        replica_token_file=v["replica_token_file"],
        replica_serve_open=v["replica_serve_open"],
        replica_tls_ca=v["replica_tls_ca"],
        replica_tls_cert=v["replica_tls_cert"],
        replica_tls_key=v["replica_tls_key"],
        tls_cert=v["tls_cert"],
        tls_key=v["tls_key"],
        tls_client_ca=v["tls_client_ca"],
        auth_tokens=v["auth_tokens"],
        auth_open_health=v["auth_open_health"],
        metrics_listen=v["metrics_listen"],
        http_listen=v["http_listen"],
    )


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
    """The settings as the README's table (``make docs`` writes it; a test keeps it true)."""
    rows = ["| flag | env / file key | default | meaning |", "| --- | --- | --- | --- |"]
    for setting in SETTINGS:
        flag = setting.flag + ("" if setting.flag_only_switch else f" {setting.metavar}")
        default = setting.default
        if isinstance(default, int) and setting.parse is parse_size:
            default = _human_size(default)
        shown = "(off)" if default in ("", False) else f"`{default}`"
        meaning = setting.help.replace("|", "\\|")
        rows.append(f"| `{flag}` | `{setting.env}` / `{setting.name}` | {shown} | {meaning} |")
    return "\n".join(rows)


def _human_size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


BEGIN_MARK = "<!-- settings:begin"
END_MARK = "<!-- settings:end -->"


def readme_with_table(readme: str) -> str:
    """The README text with its generated settings table replaced by the current one."""
    start = readme.index(BEGIN_MARK)
    start = readme.index("\n", start) + 1
    end = readme.index(END_MARK)
    return readme[:start] + markdown_table() + "\n" + readme[end:]


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--write-readme"]:
        target = Path(sys.argv[2])
        target.write_text(readme_with_table(target.read_text()))
    else:
        print(markdown_table())
