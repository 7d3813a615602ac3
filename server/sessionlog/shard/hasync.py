"""`sessionlog cluster haproxy-sync`: keep a running HAProxy on the shard map in etcd.

    sessionlog cluster haproxy-sync --cluster etcd://.. --out DIR [--socket PATH] [--once]

DIR is the folder `sessionlog cluster haproxy` wrote (haproxy.cfg, slots.map) and HAProxy runs
from. Every second the command reads the map at /sessionlog/shards; a map whose epoch is above
the last one applied is applied in two steps: DIR/slots.map is written again (atomically: a
restart or reload reads the new owners) and each slot whose owner changed is set in the running
HAProxy through its runtime API socket (``set map slots.map SLOT GROUP``; the map is named as
haproxy.cfg loads it). At start, the slots HAProxy routes now (``show map slots.map``) are the
baseline, so the first map read is applied whatever DIR held.

A map whose groups differ from the backends in DIR/haproxy.cfg (a group added or removed, or
its members changed) needs new backends, which the runtime API cannot make: the command says so
and exits 1; write the files again (`sessionlog cluster haproxy`) and reload HAProxy. Exit
status: 0 stopped (SIGTERM/SIGINT, or --once done), 1 that or HAProxy / etcd refused, 2 a usage
error.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket as sockets
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sessionlog.shard import haproxy, stored
from sessionlog.shard.shardmap import SHARDS_KEY, ShardMap, ShardMapError
from sessionlog.shard.slots import SLOTS

POLL_SECONDS = 1.0
SOCKET_TIMEOUT_SECONDS = 5.0
BATCH = 64
"""Commands sent per connection, joined with ``;`` (HAProxy's line buffer is 16 KiB)."""
_BACKEND = re.compile(r"^backend (\S+)-write$")
_SERVER = re.compile(r"^    server \S+ (\S+) ")


class SyncError(Exception):
    """HAProxy cannot follow the map at runtime (or its socket refused): exit 1."""


def owners(shard_map: ShardMap) -> dict[int, str]:
    """Slot: owning group's name, for every slot."""
    return {slot: shard_map.owner_of_slot(slot).name for slot in range(SLOTS)}


def changes(current: Mapping[int, str], wanted: Mapping[int, str]) -> dict[int, str]:
    """The slots whose owner differs between ``current`` (what HAProxy routes; a slot missing
    from it counts as changed) and ``wanted``: slot -> new group, in slot order."""
    return {slot: group for slot, group in sorted(wanted.items()) if current.get(slot) != group}


def check_groups(backends: Mapping[str, tuple[str, ...]], shard_map: ShardMap) -> None:
    """Refuse a map whose groups (names and members) are not the backends HAProxy has."""
    names = {group.name for group in shard_map.groups}
    if names == set(backends):
        for group in shard_map.groups:
            if group.members != backends[group.name]:
                raise SyncError(
                    f"the map at epoch {shard_map.epoch} changes group {group.name!r}'s members "
                    f"({', '.join(backends[group.name])} -> {', '.join(group.members)}): "
                    "HAProxy's runtime API cannot rewrite its backends; write the files again "
                    "(`sessionlog cluster haproxy`) and reload HAProxy"
                )
        return
    if names != set(backends):
        added, removed = sorted(names - set(backends)), sorted(set(backends) - names)
        raise SyncError(
            f"the map at epoch {shard_map.epoch} changes the groups (added {added or 'none'}, "
            f"removed {removed or 'none'}): HAProxy needs new backends, which its runtime API "
            "cannot add; write the files again (`sessionlog cluster haproxy`) and reload HAProxy"
        )


def backends(config: str) -> dict[str, tuple[str, ...]]:
    """The groups haproxy.cfg has write backends for: name -> members, in order."""
    found: dict[str, tuple[str, ...]] = {}
    group = None
    for line in config.splitlines():
        if match := _BACKEND.match(line):
            group = match.group(1)
            found[group] = ()
        elif line.startswith("backend "):
            group = None
        elif group is not None and (match := _SERVER.match(line)):
            found[group] += (match.group(1),)
    return found


def command(path: str, line: str) -> str:
    """One runtime API command line (several may be joined with ``;``); HAProxy's answer."""
    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as conn:
        conn.settimeout(SOCKET_TIMEOUT_SECONDS)
        try:
            conn.connect(path)
            conn.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except OSError as exc:
            raise SyncError(f"HAProxy's runtime API at {path}: {exc}") from exc
    return b"".join(chunks).decode(errors="replace")


def show_map(path: str) -> dict[int, str]:
    """What HAProxy's slots.map holds now: slot -> group."""
    found: dict[int, str] = {}
    for line in command(path, f"show map {haproxy.MAP_FILE}").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit():  # "0xADDR SLOT GROUP"
            found[int(parts[1])] = parts[2]
        elif line.strip():
            raise SyncError(f"HAProxy's runtime API at {path}: show map: {line.strip()}")
    return found


def set_slots(path: str, moved: Mapping[int, str]) -> None:
    """``set map`` each slot to its group, BATCH a connection; any answer but blank fails."""
    items = list(moved.items())
    for start in range(0, len(items), BATCH):
        lines = [f"set map {haproxy.MAP_FILE} {s} {g}" for s, g in items[start : start + BATCH]]
        answer = command(path, ";".join(lines)).strip()
        if answer:
            raise SyncError(f"HAProxy's runtime API at {path}: set map: {answer}")


def write_map(out: Path, shard_map: ShardMap) -> None:
    """DIR/slots.map for the next restart or reload, replaced atomically."""
    target = out / haproxy.MAP_FILE
    temporary = out / f".{haproxy.MAP_FILE}.{os.getpid()}"
    temporary.write_text(haproxy.render_map(shard_map), encoding="utf-8")
    os.replace(temporary, target)


class Sync:
    """The state between two polls: the epoch applied and what HAProxy routes."""

    def __init__(self, out: Path, socket: str) -> None:
        self.out = out
        self.socket = socket
        try:
            config = (out / haproxy.CONFIG_FILE).read_text(encoding="utf-8")
        except OSError as exc:
            raise SyncError(f"cannot read {out / haproxy.CONFIG_FILE}: {exc.strerror}") from exc
        self.backends = backends(config)
        self.epoch = -1
        self.routed = show_map(socket)

    def apply(self, shard_map: ShardMap) -> int | None:
        """Apply a map above the last epoch: the number of slots set, None if not newer."""
        if shard_map.epoch <= self.epoch:
            return None
        check_groups(self.backends, shard_map)
        wanted = owners(shard_map)
        moved = changes(self.routed, wanted)
        write_map(self.out, shard_map)
        set_slots(self.socket, moved)
        self.routed, self.epoch = wanted, shard_map.epoch
        return len(moved)


def add_command(actions: Any) -> None:
    """Register `sessionlog cluster haproxy-sync`."""
    command_ = actions.add_parser(
        "haproxy-sync",
        help="apply the shard map in etcd to a running HAProxy (runtime API), as it changes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command_.add_argument(
        "--cluster",
        required=True,
        metavar="etcd://HOST:PORT[,HOST:PORT]",
        help="the etcd endpoints (as `sessionlog serve --cluster`)",
    )
    command_.add_argument(
        "--out", required=True, metavar="DIR", help="the folder `cluster haproxy` wrote"
    )
    command_.add_argument(
        "--socket",
        metavar="PATH",
        help=f"HAProxy's runtime API socket (default DIR/{haproxy.SOCKET_FILE})",
    )
    command_.add_argument("--once", action="store_true", help="apply the map once and exit")
    command_.set_defaults(run=run)


def run(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    """The command; ``stop`` (set by SIGTERM/SIGINT when None and in the main thread) ends it."""
    from sessionlog.cluster import etcd
    from sessionlog.cluster.settings import parse_cluster

    out = Path(args.out)
    socket = args.socket or str(out.absolute() / haproxy.SOCKET_FILE)
    try:
        endpoints = etcd.Endpoints(parse_cluster(args.cluster), 3.0)
    except ValueError as exc:
        print(f"sessionlog cluster haproxy-sync: --cluster: {exc}", file=sys.stderr)
        return 2
    if stop is None:
        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: stop.set())
    try:
        sync = Sync(out, socket)
        while True:
            try:
                shard_map, _ = stored.read(endpoints)
            except (etcd.EtcdUnavailable, etcd.EtcdError) as exc:
                if args.once:
                    raise SyncError(f"etcd: {exc}") from exc
                shard_map = None  # etcd away for a moment: HAProxy keeps routing; try again
            except ShardMapError as exc:
                if args.once:
                    raise SyncError(str(exc)) from exc
                shard_map = None  # the servers ignore a damaged value too
            if shard_map is not None:
                moved = sync.apply(shard_map)
                if moved is not None:
                    print(
                        f"applied the map at epoch {shard_map.epoch}: {moved} slot(s) set in "
                        f"HAProxy, {out / haproxy.MAP_FILE} written",
                        flush=True,
                    )
            elif args.once:
                raise SyncError(f"etcd holds no shard map at {SHARDS_KEY}")
            if args.once or stop.wait(POLL_SECONDS):
                return 0
    except SyncError as exc:
        print(f"sessionlog cluster haproxy-sync: {exc}", file=sys.stderr)
        return 1
    finally:
        endpoints.close()


def wait_socket(path: str, seconds: float) -> None:
    """Until HAProxy answers on ``path`` (bounded), else SyncError."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            command(path, "show info")
            return
        except SyncError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
