"""HAProxy in front of a sharded cluster: `sessionlog cluster haproxy` writes its configuration.

From a shard map it writes two files into one folder:

    haproxy.cfg   a frontend that speaks HTTP/2 (gRPC) and, per group, a write backend and a
                  read backend
    slots.map     one line per slot: ``SLOT GROUP`` (HAProxy's map_int file)

The frontend computes a call's slot exactly as ``shard.slots.slot_of`` does, from the
``x-session-id`` header the clients send: ``req.hdr(x-session-id),url_dec,crc32,mod(1024)``
(the clients percent-encode an id that is not plain ASCII; HAProxy's crc32 converter is zlib's
CRC-32), looks the group up in slots.map, then picks that group's read
backend for the read-only RPCs (READ_METHODS: any member that serves, health-checked with
``GET /healthz``) and its write backend for every other call (the one member that takes writes,
checked with ``GET /primary``). A call without the header (ListSessions, the admin and health
services) goes to the map's first group. The checks use each member's ``--http-listen`` address,
which the map lists as the group's ``http``.

Timeouts: HAProxy ends a stream on which nothing moved for ``timeout client`` / ``timeout
server``. An idle FollowSession (Since with follow) stream carries a heartbeat every
``--heartbeat`` seconds (15 by default), so the timeout must stay well above the servers'
heartbeat: the default, 60 s, is four heartbeats. A slot moving (a new epoch, same groups):
``sessionlog cluster haproxy-sync`` (shard.hasync) applies it through the runtime API socket the
configuration opens. A change of groups or members: write the files again and reload HAProxy
(``systemctl reload haproxy``, or ``haproxy -f haproxy.cfg -sf PID``); the old process ends the
streams it still carries one timeout later (``hard-stop-after``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sessionlog.defaults import DEFAULT_HEARTBEAT_SECONDS
from sessionlog.shard.shardmap import Group, ShardMap, ShardMapError, is_address
from sessionlog.shard.slots import SESSION_HEADER, SLOTS

SERVICE = "/sessionlog.v1.SessionLogService/"
READ_METHODS = (
    "Since",
    "ListEvents",
    "Surface",
    "DeriveMessages",
    "GetState",
    "GetUsage",
    "GetSession",
    "ListSessions",
    "GetShardMap",
    "FollowSessions",
)
"""The SessionLogService RPCs that only read: any serving member of the group answers them."""
CONFIG_FILE = "haproxy.cfg"
MAP_FILE = "slots.map"
SOCKET_FILE = "haproxy.sock"
"""The runtime API socket's default name, in the output folder (`cluster haproxy-sync`)."""
MAX_SOCKET_BYTES = 107
"""A UNIX socket path's limit on Linux (sun_path is 108 bytes with its NUL)."""
DEFAULT_BIND = "127.0.0.1:50050"
DEFAULT_TIMEOUT_SECONDS = 60.0
"""HAProxy's client, server and tunnel timeout: four of the servers' default heartbeat."""
DEFAULT_CHECK_SECONDS = 1.0
"""Between two health checks of one member."""


def _seconds(value: float) -> str:
    """A duration as HAProxy writes it: whole seconds as ``60s``, else milliseconds."""
    millis = round(value * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def _split(address: str) -> tuple[str, str]:
    """Host and port; an IPv6 host keeps its brackets (HAProxy's ``addr`` refuses ``::1``)."""
    host, _, port = address.rpartition(":")
    return host, port


def _check_bind(bind: str) -> None:
    """``HOST:PORT``, ``[v6]:PORT`` or ``:PORT`` (every address): a line of haproxy.cfg."""
    if not is_address(bind) and not (bind.startswith(":") and is_address("any" + bind)):
        raise ShardMapError(f"--bind {bind!r}: HAProxy's listen address is HOST:PORT or :PORT")


def _bind_argument(text: str) -> str:
    try:
        _check_bind(text)
    except ShardMapError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _check_groups(shard_map: ShardMap) -> None:
    for group in shard_map.groups:
        if not group.http:
            raise ShardMapError(
                f"group {group.name!r} has no `http` addresses: HAProxy health-checks GET "
                "/primary and GET /healthz on each member's --http-listen address; list them "
                f'in the map, one per member in the members\' order (http = ["HOST:PORT", ...])'
            )


def render_map(shard_map: ShardMap) -> str:
    """slots.map: ``SLOT GROUP`` for every slot, in slot order."""
    return "".join(f"{slot} {shard_map.owner_of_slot(slot).name}\n" for slot in range(SLOTS))


def _backend(group: Group, kind: str, check: float) -> list[str]:
    path = "/primary" if kind == "write" else "/healthz"
    lines = [
        f"backend {group.name}-{kind}",
        "    balance first" if kind == "write" else "    balance roundrobin",
        f"    option httpchk GET {path}",
        "    http-check expect status 200",
        f"    default-server inter {_seconds(check)} fall 2 rise 2 "
        "on-marked-down shutdown-sessions",
    ]
    for number, (member, http) in enumerate(zip(group.members, group.http, strict=True), 1):
        host, port = _split(http)
        # gRPC over cleartext HTTP/2 to the member; its checks in HTTP/1 to its --http-listen
        # (check-proto is not inherited from default-server: it is on every server line).
        lines.append(
            f"    server {group.name}-{number} {member} proto h2 "
            f"check check-proto h1 addr {host} port {port}"
        )
    return lines


def render_config(
    shard_map: ShardMap,
    bind: str = DEFAULT_BIND,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    check: float = DEFAULT_CHECK_SECONDS,
    socket: str = SOCKET_FILE,
) -> str:
    """haproxy.cfg for ``shard_map``: the frontend on ``bind``, two backends per group and the
    runtime API on the UNIX socket ``socket`` (absolute: HAProxy binds it after reading the
    configuration, relative to its own working folder, not to this file's)."""
    _check_groups(shard_map)
    _check_bind(bind)
    if not (MIN_SECONDS <= timeout <= MAX_SECONDS and MIN_SECONDS <= check <= MAX_SECONDS):
        raise ShardMapError(
            f"the timeout and the check interval must be {MIN_SECONDS:g} to {MAX_SECONDS:g} s"
        )
    if not socket or len(socket.encode()) > MAX_SOCKET_BYTES or any(c.isspace() for c in socket):
        raise ShardMapError(
            f"--socket {socket!r}: a UNIX socket path of at most {MAX_SOCKET_BYTES} bytes, "
            "without spaces (pass a shorter --socket)"
        )
    first = shard_map.groups[0].name
    reads = " ".join(SERVICE + method for method in READ_METHODS)
    lines = [
        f"# Written by `sessionlog cluster haproxy` from the shard map at epoch {shard_map.epoch}.",
        "# Do not edit: write it again from the map, then reload HAProxy.",
        "global",
        f"    default-path config  # {MAP_FILE} is read beside this file",
        "    # After a reload (-sf), the old process ends what it still carries (follow streams)",
        "    # at the latest this long after: the clients resume through the new one.",
        f"    hard-stop-after {_seconds(timeout)}",
        "    # The runtime API: `sessionlog cluster haproxy-sync` sets each moved slot in",
        f"    # {MAP_FILE} through it (`set map {MAP_FILE} SLOT GROUP`).",
        f"    stats socket {socket} mode 600 level admin",
        "",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        f"    timeout check {_seconds(min(check * 2, 5.0))}",
        f"    # Above the servers' follow heartbeat (--heartbeat, {DEFAULT_HEARTBEAT_SECONDS:g} s "
        "by default): an idle",
        "    # follow stream carries one per heartbeat, so it is never idle this long.",
        f"    timeout client {_seconds(timeout)}",
        f"    timeout server {_seconds(timeout)}",
        f"    timeout tunnel {_seconds(timeout)}",
        "    retries 2",
        "",
        "frontend sessionlog",
        f"    bind {bind} proto h2",
        f"    acl has_session req.hdr({SESSION_HEADER}) -m found",
        f"    acl read_call path {reads}",
        f"    http-request set-var(txn.group) req.hdr({SESSION_HEADER}),url_dec,crc32,mod({SLOTS}),"
        f"map_int({MAP_FILE}) if has_session",
        f"    http-request set-var(txn.group) str({first}) unless {{ var(txn.group) -m found }}",
        "    use_backend %[var(txn.group)]-read if read_call",
        "    use_backend %[var(txn.group)]-write",
        f"    default_backend {first}-write",
    ]
    for group in shard_map.groups:
        lines += ["", *_backend(group, "write", check), "", *_backend(group, "read", check)]
    return "\n".join(lines) + "\n"


def write(
    shard_map: ShardMap,
    out: Path,
    bind: str = DEFAULT_BIND,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    check: float = DEFAULT_CHECK_SECONDS,
    socket: str | None = None,
) -> tuple[Path, Path]:
    """Write haproxy.cfg and slots.map into ``out`` (made if missing); their paths. The runtime
    API socket: ``socket``, else haproxy.sock in ``out`` (as an absolute path)."""
    if socket is None:
        socket = str(out.absolute() / SOCKET_FILE)
    config = render_config(shard_map, bind, timeout, check, socket)
    out.mkdir(parents=True, exist_ok=True)
    config_path, map_path = out / CONFIG_FILE, out / MAP_FILE
    map_path.write_text(render_map(shard_map), encoding="utf-8")
    config_path.write_text(config, encoding="utf-8")
    return config_path, map_path


MIN_SECONDS, MAX_SECONDS = 0.001, 86_400.0
"""The durations written: whole milliseconds (0 would read as no timeout), at most a day."""


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not MIN_SECONDS <= value <= MAX_SECONDS:  # False for nan too
        raise argparse.ArgumentTypeError(
            f"{text!r}: must be from {MIN_SECONDS:g} to {MAX_SECONDS:g} seconds"
        )
    return value


def add_command(actions: Any) -> None:
    """Register `sessionlog cluster haproxy` on the `cluster` command group's subparsers."""
    command = actions.add_parser(
        "haproxy",
        help="write an HAProxy configuration that routes each session to its group",
        description="Write HAProxy's haproxy.cfg and slots.map for a shard map (TOML): calls "
        f"carrying {SESSION_HEADER} go to the group owning the session's slot (reads to any "
        "serving member, writes to the primary), health-checked on the members' http "
        "addresses. A slot moving later: `sessionlog cluster haproxy-sync` applies it through "
        "HAProxy's runtime API; a change of groups or members: run this again and reload.",
    )
    command.add_argument("--shard-map", required=True, metavar="FILE", help="the map (TOML)")
    command.add_argument("--out", required=True, metavar="DIR", help="where the files go")
    command.add_argument(
        "--bind",
        type=_bind_argument,
        default=DEFAULT_BIND,
        metavar="HOST:PORT",
        help="where HAProxy listens",
    )
    command.add_argument(
        "--timeout",
        type=_positive,
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="HAProxy's client/server/tunnel timeout; keep it above the servers' --heartbeat "
        f"(default {DEFAULT_TIMEOUT_SECONDS:g})",
    )
    command.add_argument(
        "--check-interval",
        type=_positive,
        default=DEFAULT_CHECK_SECONDS,
        metavar="SECONDS",
        help=f"between two health checks of a member (default {DEFAULT_CHECK_SECONDS:g})",
    )
    command.add_argument(
        "--socket",
        metavar="PATH",
        help=f"HAProxy's runtime API socket (default DIR/{SOCKET_FILE}, absolute)",
    )
    command.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        shard_map = ShardMap.load(args.shard_map)
        paths = write(
            shard_map, Path(args.out), args.bind, args.timeout, args.check_interval, args.socket
        )
    except ShardMapError as exc:  # a map that will not do: refused, as `map check` does
        print(f"sessionlog: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"sessionlog: cannot write into {args.out}: {exc.strerror}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0
