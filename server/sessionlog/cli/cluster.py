"""`sessionlog cluster slot | map | haproxy`: look up slots, check a shard map, keep it in etcd,
and write HAProxy's configuration from it (shard.haproxy).

    sessionlog cluster slot ID... [--shard-map FILE]     each id's slot (and owner, with a map)
    sessionlog cluster map check FILE                    validate a TOML map; print its groups
    sessionlog cluster map put FILE --cluster etcd://..  store it in etcd (epoch must grow)
    sessionlog cluster map get --cluster etcd://.. [--json]
    sessionlog cluster haproxy --shard-map FILE --out DIR   haproxy.cfg and slots.map
    sessionlog cluster haproxy-sync --cluster etcd://.. --out DIR   HAProxy follows the map
    sessionlog cluster move-slot S --to G --cluster etcd://..  move a slot live (shard.move)

``map put`` writes the key in one etcd transaction that compares the key's revision with the one
it read, so of two operators putting maps at once one wins and the other is told to read again;
a map whose epoch is not above the stored one is refused, because every server ignores it.
Exit status: 0 done, 1 the map or etcd refused (the message says why), 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from sessionlog.shard import haproxy, hasync, move, stored
from sessionlog.shard.shardmap import SHARDS_KEY, ShardMap, ShardMapError
from sessionlog.shard.slots import SLOTS, slot_of

if TYPE_CHECKING:
    from sessionlog.cluster import etcd

ETCD_TIMEOUT_SECONDS = 3.0


def add_commands(commands: Any) -> None:
    """Register `sessionlog cluster ...` on the `sessionlog` parser."""
    cluster = commands.add_parser(
        "cluster",
        help="shard maps and slots for a cluster of groups",
        description="Sessions are placed on groups by slot (crc32 of the UTF-8 id, mod "
        f"{SLOTS}); a shard map says which group owns which slots.",
    )
    actions = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)

    slot = actions.add_parser(
        "slot",
        help="the slot of session ids (and their owner, with --shard-map)",
        description=f"Print each session id's slot: crc32 of its UTF-8 bytes mod {SLOTS}.",
    )
    slot.add_argument("session_ids", metavar="ID", nargs="+", help="session ids")
    slot.add_argument("--shard-map", metavar="FILE", help="a TOML map: also print the owner")
    slot.set_defaults(run=_slot)

    shard_map = actions.add_parser(
        "map",
        help="check a shard map, or put and get it in etcd",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    map_actions = shard_map.add_subparsers(dest="map_command", metavar="ACTION", required=True)
    check = map_actions.add_parser("check", help="validate a TOML shard map and summarize it")
    check.add_argument("file", metavar="FILE", help="the TOML map")
    check.set_defaults(run=_check)
    put = map_actions.add_parser(
        "put", help=f"store a TOML map in etcd ({SHARDS_KEY}); its epoch must grow"
    )
    put.add_argument("file", metavar="FILE", help="the TOML map")
    _etcd_option(put)
    put.set_defaults(run=_put)
    get = map_actions.add_parser("get", help="print the map stored in etcd (TOML)")
    _etcd_option(get)
    get.add_argument("--json", action="store_true", help="print it as JSON, as etcd holds it")
    get.set_defaults(run=_get)

    haproxy.add_command(actions)
    hasync.add_command(actions)
    move.add_command(actions)


def _etcd_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cluster",
        required=True,
        metavar="etcd://HOST:PORT[,HOST:PORT]",
        help="the etcd endpoints (as `sessionlog serve --cluster`)",
    )


def _fail(message: str) -> int:
    print(f"sessionlog cluster: {message}", file=sys.stderr)
    return 1


def _slot(args: argparse.Namespace) -> int:
    for session_id in args.session_ids:
        try:
            session_id.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 on the command line
            shown = session_id.encode("utf-8", "surrogateescape")[:60]
            print(f"sessionlog cluster slot: {shown!r} is not valid UTF-8", file=sys.stderr)
            return 2
    shard_map = None
    if args.shard_map:
        try:
            shard_map = ShardMap.load(args.shard_map)
        except ShardMapError as exc:
            return _fail(str(exc))
    for session_id in args.session_ids:
        slot = slot_of(session_id)
        if shard_map is None:
            print(f"{session_id}\t{slot}")
        else:
            owner = shard_map.owner_of_slot(slot)
            print(f"{session_id}\t{slot}\t{owner.name}\t{owner.primary}")
    return 0


def _summary(shard_map: ShardMap) -> str:
    lines = [f"epoch {shard_map.epoch}, {len(shard_map.groups)} group(s), {SLOTS} slots"]
    for group in shard_map.groups:
        lines.append(
            f"  {group.name}: {group.slot_count} slots ({', '.join(group.range_text())}), "
            f"members {', '.join(group.members)}"
        )
    return "\n".join(lines)


def _check(args: argparse.Namespace) -> int:
    try:
        shard_map = ShardMap.load(args.file)
    except ShardMapError as exc:
        return _fail(str(exc))
    print(_summary(shard_map))
    return 0


class _Usage(Exception):
    """A malformed argument: exit 2."""


def _usage(exc: _Usage) -> int:
    print(f"sessionlog cluster: {exc}", file=sys.stderr)
    return 2


def _endpoints(args: argparse.Namespace) -> etcd.Endpoints:
    # Here, not at the top: every other command of the CLI starts without requests and etcd3gw.
    from sessionlog.cluster import etcd
    from sessionlog.cluster.settings import parse_cluster

    try:
        return etcd.Endpoints(parse_cluster(args.cluster), ETCD_TIMEOUT_SECONDS)
    except ValueError as exc:  # ShardMapError is one too: not a map's fault, a usage error
        raise _Usage(f"--cluster: {exc}") from exc


def _put(args: argparse.Namespace) -> int:
    from sessionlog.cluster import etcd

    try:
        endpoints = _endpoints(args)
    except _Usage as exc:
        return _usage(exc)
    try:
        shard_map = ShardMap.load(args.file)
    except ShardMapError as exc:
        endpoints.close()
        return _fail(str(exc))
    try:
        found, _ = endpoints.get(SHARDS_KEY)
        current = None
        if found is not None:
            try:
                current = stored.decode(found.value)
            except ShardMapError as exc:
                # A damaged key is replaced by a valid map: say so, but do not refuse.
                print(f"sessionlog cluster: {exc}; replacing it", file=sys.stderr)
        revision = found.mod_revision if found is not None else 0
        if current is not None and shard_map.epoch <= current.epoch:
            return _fail(
                f"{args.file} has epoch {shard_map.epoch}, not above the stored map's "
                f"{current.epoch}: servers keep the newer map, so raise the epoch"
            )
        if not stored.put(endpoints, shard_map, revision):
            return _fail(f"{SHARDS_KEY} changed while this map was being put: read it again")
    except (etcd.EtcdUnavailable, etcd.EtcdError) as exc:
        return _fail(f"etcd: {exc}")
    finally:
        endpoints.close()
    print(f"put the shard map at epoch {shard_map.epoch} in {SHARDS_KEY}")
    print(_summary(shard_map))
    return 0


def _get(args: argparse.Namespace) -> int:
    from sessionlog.cluster import etcd

    try:
        endpoints = _endpoints(args)
    except _Usage as exc:
        return _usage(exc)
    try:
        current, _ = stored.read(endpoints)
    except ShardMapError as exc:
        return _fail(str(exc))
    except (etcd.EtcdUnavailable, etcd.EtcdError) as exc:
        return _fail(f"etcd: {exc}")
    finally:
        endpoints.close()
    if current is None:
        return _fail(f"etcd holds no shard map at {SHARDS_KEY} (`sessionlog cluster map put`)")
    if args.json:
        print(json.dumps(current.to_dict(), indent=2, sort_keys=True))
    else:
        print(current.to_toml(), end="")
    return 0
