"""`sessionlog dev cluster`: a local etcd and three-member groups on loopback, in one command.

    sessionlog dev cluster [--dir ./sessionlog-cluster] [--port 50051] [--etcd-port 12379]
                           [--groups N] [--proxy-port 50050]

It starts Debian's ``etcd`` (a single member, its data in DIR/etcd) and three `sessionlog serve
--cluster` members (DIR/m1..m3, ports PORT..PORT+2) with ``--ack replica --sync-replicas 1``,
waits until one of them leads, prints where everything is and how a client reaches the group,
then waits. A member that exits (``kill -9`` the leader to watch a failover) is started again
on its folder two seconds later and rejoins as a follower. Ctrl-C (or SIGTERM) stops every
member, then etcd, each by its PID (SIGTERM, then
SIGKILL for one that does not exit). The folders stay: a second run continues the same group.
Logs go to DIR/*.log.

With ``--groups N`` (N > 1; ``make cluster`` starts two) it starts N groups of three (g1..gN,
members m1..m{3N}, gRPC ports PORT.., console ports PORT+1000..), puts a shard map that splits the
slots evenly into etcd (``/sessionlog/shards``) before the members start with ``--shard-map
etcd``, and runs HAProxy (Debian's ``haproxy``) in front on ``--proxy-port`` with the
configuration ``sessionlog cluster haproxy`` writes (DIR/haproxy/), and ``sessionlog cluster
haproxy-sync`` beside it, so that HAProxy follows a slot moved in etcd by itself.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sessionlog.shard.shardmap import ShardMap

MEMBERS = 3
GROUP = "dev"
READY_SECONDS = 60.0
STOP_SECONDS = 10.0
HTTP_PORT_OFFSET = 1000
"""With several groups, member N's console (--http-listen, HAProxy's health checks) is on its
gRPC port plus this."""
RESTART_AFTER_SECONDS = 2.0
"""A member that exits is started again this long after (one that exits again as soon after its
restart stops the whole group: it cannot start)."""


class DevError(Exception):
    """The group could not start; the message says why."""


def add_commands(commands: Any) -> None:
    """Register `sessionlog dev cluster` on the `sessionlog` parser."""
    dev = commands.add_parser(
        "dev", help="try things locally (a cluster)", description="Local set-ups to try things."
    )
    actions = dev.add_subparsers(dest="dev_command", metavar="ACTION", required=True)
    cluster = actions.add_parser(
        "cluster",
        help="etcd and three-member groups on 127.0.0.1, until Ctrl-C",
        description="Start etcd (the `etcd` binary: apt-get install etcd-server) and, for each "
        "of --groups groups, three `sessionlog serve --cluster` members with --ack replica "
        "--sync-replicas 1 on 127.0.0.1 (with two groups or more, --shard-map etcd, an even "
        "shard map in etcd and HAProxy in front, the `haproxy` binary), print their addresses "
        "and a client example, and stop them all on Ctrl-C.",
    )
    cluster.add_argument(
        "--dir", default="./sessionlog-cluster", help="where the folders and logs go"
    )
    cluster.add_argument(
        "--port", type=int, default=50051, help="the first member's port (the others follow)"
    )
    cluster.add_argument("--etcd-port", type=int, default=12379, help="etcd's client port")
    cluster.add_argument("--lease-ttl", type=int, default=5, help="the members' --lease-ttl")
    cluster.add_argument(
        "--groups",
        type=int,
        default=1,
        choices=range(1, 10),
        metavar="N",
        help="groups of three (more than one: a shard map in etcd and HAProxy in front)",
    )
    cluster.add_argument(
        "--proxy-port", type=int, default=50050, help="HAProxy's port (with --groups 2 or more)"
    )
    cluster.set_defaults(run=run_cluster)


@dataclass(frozen=True)
class Member:
    """One member process: its name (m1..), group, gRPC and console addresses."""

    name: str
    group: str
    address: str
    http: str


def _layout(groups: int, port: int) -> list[Member]:
    if groups == 1:
        return [Member(f"m{i + 1}", GROUP, f"127.0.0.1:{port + i}", "") for i in range(MEMBERS)]
    return [
        Member(
            f"m{n + 1}",
            f"g{n // MEMBERS + 1}",
            f"127.0.0.1:{port + n}",
            f"127.0.0.1:{port + HTTP_PORT_OFFSET + n}",
        )
        for n in range(groups * MEMBERS)
    ]


def run_cluster(args: argparse.Namespace) -> int:
    root = Path(args.dir).absolute()
    root.mkdir(parents=True, exist_ok=True)
    processes: list[tuple[str, subprocess.Popen[bytes]]] = []
    stopping = {"now": False}

    def stop_on(signum: int, frame: Any) -> None:
        stopping["now"] = True

    signal.signal(signal.SIGTERM, stop_on)
    signal.signal(signal.SIGINT, stop_on)
    try:
        processes.append(("etcd", _start_etcd(root, args.etcd_port)))
        cluster = f"etcd://127.0.0.1:{args.etcd_port}"
        members = _layout(args.groups, args.port)
        if args.groups > 1:
            shard_map = _put_map(args.etcd_port, members)
        for member in members:
            processes.append((member.name, _start_member(root, member, cluster, args.lease_ttl)))
        ports = f"{args.port}..{args.port + len(members) - 1}"
        leaders = {
            group: _wait_leader(root, ports, args.etcd_port, group, processes, stopping)
            for group in dict.fromkeys(m.group for m in members)
        }
        if None in leaders.values():
            return 130
        proxy = ""
        if args.groups > 1:
            proxy = f"127.0.0.1:{args.proxy_port}"
            processes.append(("haproxy", _start_haproxy(root, shard_map, proxy)))
            processes.append(("haproxy-sync", _start_sync(root, cluster)))
        pids = {name: process.pid for name, process in processes}
        _print_cluster(root, cluster, members, leaders, pids, proxy)
        by_name = {member.name: member for member in members}
        restarted_at = dict.fromkeys(pids, float("-inf"))
        while not stopping["now"]:
            for index, (name, process) in enumerate(processes):
                if process.poll() is None:
                    continue
                log = root / f"{name}.log"
                if name in ("etcd", "haproxy", "haproxy-sync"):
                    raise DevError(f"{name} exited with {process.returncode}; see {log}")
                if time.monotonic() - restarted_at[name] < RESTART_AFTER_SECONDS:
                    raise DevError(f"{name} exited with {process.returncode} again; see {log}")
                # A member killed to try a failover: the others carry on (one of them takes the
                # lead), and it comes back on its folder a moment later, as a follower.
                print(
                    f"{name} (pid {process.pid}) exited with {process.returncode}; the others "
                    f"carry on; restarting it in {RESTART_AFTER_SECONDS:.0f} s",
                    flush=True,
                )
                time.sleep(RESTART_AFTER_SECONDS)
                restarted = _start_member(root, by_name[name], cluster, args.lease_ttl)
                processes[index] = (name, restarted)
                restarted_at[name] = time.monotonic()
                print(f"{name} restarted: pid {restarted.pid}", flush=True)
            time.sleep(0.2)
        print("stopping the members, then etcd")
        return 0
    except DevError as exc:
        print(f"sessionlog: {exc}", file=sys.stderr)
        return 1
    finally:
        for name, process in reversed(processes):
            _stop(name, process)


def _start_etcd(root: Path, port: int) -> subprocess.Popen[bytes]:
    import requests  # here: every other command of the CLI starts without it

    from sessionlog.cluster.etcd import etcd_command

    binary = shutil.which("etcd")
    if binary is None:
        raise DevError(
            "etcd is not on PATH: install it (`make etcd-tools`, or apt-get install -y etcd-server)"
        )
    client = f"http://127.0.0.1:{port}"
    argv, env = etcd_command(binary, "dev", root / "etcd", port, port + 1)
    process = _spawn(argv, root / "etcd.log", env)
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DevError(f"etcd exited with {process.returncode}; see {root / 'etcd.log'}")
        try:
            if requests.get(f"{client}/health", timeout=1).json().get("health") == "true":
                return process
        except (requests.RequestException, ValueError):
            pass
        time.sleep(0.1)
    _stop("etcd", process)
    raise DevError(f"etcd did not become healthy; see {root / 'etcd.log'}")


def _start_member(
    root: Path, member: Member, cluster: str, lease_ttl: int
) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-m", "sessionlog.cli", "serve",
        "--data", str(root / member.name),
        "--listen", member.address,
        "--advertise", member.address,
        "--cluster", cluster,
        "--group", member.group,
        "--lease-ttl", str(lease_ttl),
        "--ack", "replica",
        "--sync-replicas", "1",
    ]  # fmt: skip
    if member.http:
        argv += ["--shard-map", "etcd", "--http-listen", member.http]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONLOG_")}
    return _spawn(argv, root / f"{member.name}.log", env)


def _put_map(etcd_port: int, members: list[Member]) -> ShardMap:
    """An even split of the slots over the groups, in etcd before any member reads it (a map
    already there, from an earlier run of the same folder, is kept when it has the same groups)."""
    from sessionlog.cluster import etcd
    from sessionlog.cluster.settings import parse_cluster
    from sessionlog.shard import stored
    from sessionlog.shard.shardmap import ShardMap, ShardMapError

    groups: dict[str, list[Member]] = {}
    for member in members:
        groups.setdefault(member.group, []).append(member)
    wanted = ShardMap.even_split(
        {name: [m.address for m in group] for name, group in groups.items()},
        http={name: [m.http for m in group] for name, group in groups.items()},
    )
    endpoints = etcd.Endpoints(parse_cluster(f"etcd://127.0.0.1:{etcd_port}"), 3.0)
    try:
        found, revision = stored.read(endpoints)
        if found is not None and {g.name for g in found.groups} == set(groups):
            return found
        if not stored.put(endpoints, wanted, revision):
            raise DevError("the shard map in etcd changed while it was being put; start again")
    except (etcd.EtcdUnavailable, etcd.EtcdError, ShardMapError) as exc:
        raise DevError(f"could not put the shard map into etcd: {exc}") from exc
    return wanted


def _start_haproxy(root: Path, shard_map: ShardMap, bind: str) -> subprocess.Popen[bytes]:
    from sessionlog.shard import haproxy

    binary = shutil.which("haproxy")
    if binary is None:
        raise DevError(
            "haproxy is not on PATH: install it (`make haproxy-tools`, or apt-get install -y "
            "haproxy)"
        )
    config, _ = haproxy.write(shard_map, root / "haproxy", bind=bind)
    process = _spawn([binary, "-db", "-f", str(config)], root / "haproxy.log", dict(os.environ))
    time.sleep(0.5)
    if process.poll() is not None:
        raise DevError(f"haproxy exited with {process.returncode}; see {root / 'haproxy.log'}")
    return process


def _start_sync(root: Path, cluster: str) -> subprocess.Popen[bytes]:
    """`sessionlog cluster haproxy-sync`: a slot moved (`cluster move-slot`) is set in HAProxy."""
    from sessionlog.shard import haproxy, hasync

    try:
        hasync.wait_socket(str(root / "haproxy" / haproxy.SOCKET_FILE), 10.0)
    except hasync.SyncError as exc:
        raise DevError(str(exc)) from exc
    argv = [
        sys.executable, "-m", "sessionlog.cli", "cluster", "haproxy-sync",
        "--cluster", cluster, "--out", str(root / "haproxy"),
    ]  # fmt: skip
    return _spawn(argv, root / "haproxy-sync.log", dict(os.environ))


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        # A session of its own: Ctrl-C in the terminal reaches this command only, which then
        # stops each child in order.
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _wait_leader(
    root: Path,
    ports: str,
    port: int,
    group: str,
    processes: list[tuple[str, subprocess.Popen[bytes]]],
    stopping: dict[str, bool],
) -> str | None:
    """The group's leader's address once one leads (None when stopped first)."""
    import requests

    from sessionlog.cluster.members import GroupKeys

    key = GroupKeys(group).leader
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline and not stopping["now"]:
        for name, process in processes:
            if process.poll() is not None:
                raise DevError(_start_failure(root, name, process.returncode, ports))
        try:
            reply = requests.post(
                f"http://127.0.0.1:{port}/v3/kv/range", json={"key": _b64(key)}, timeout=1
            ).json()
        except (requests.RequestException, ValueError):
            reply = {}
        for kv in reply.get("kvs", []):
            return base64.b64decode(kv["value"]).decode()
        time.sleep(0.2)
    if stopping["now"]:
        return None
    raise DevError(
        f"no member of {group} became the leader within {READY_SECONDS:.0f} s; see the logs"
    )


LOG_LINES_SHOWN = 3
"""How many of its log's last lines a process that exits while starting gets in the message."""


def _start_failure(root: Path, name: str, returncode: int, ports: str) -> str:
    """Why ``name`` did not start: the end of its log and the options that move the ports (a
    port already taken, by `make run` or a cluster already up, is the usual cause)."""
    log = root / f"{name}.log"
    tail = "".join(f"\n  {line}" for line in _last_lines(log)) or " (empty)"
    return (
        f"{name} exited with {returncode} while starting; the end of {log}:{tail}\n"
        f"if a port is taken (`make run`, or another cluster), give others: --port (the "
        f"members' first port; {ports} now), --etcd-port"
    )


def _last_lines(log: Path, count: int = LOG_LINES_SHOWN) -> list[str]:
    """The last ``count`` non-blank lines of ``log`` (none when it cannot be read)."""
    try:
        with log.open("rb") as file:
            file.seek(0, os.SEEK_END)
            file.seek(max(0, file.tell() - 64 * 1024))
            text = file.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-count:]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _print_cluster(
    root: Path,
    cluster: str,
    members: list[Member],
    leaders: dict[str, str | None],
    pids: dict[str, int],
    proxy: str,
) -> None:
    if not proxy:
        _print_group(root, cluster, [m.address for m in members], str(leaders[GROUP]), pids)
        return
    listing = "\n".join(
        f"  {m.name}  {m.group}  {m.address}  console {m.http}  pid {pids[m.name]}"
        f"{'  (leader)' if leaders[m.group] == m.address else ''}"
        for m in members
    )
    first = members[0].group
    leader_pid = next(pids[m.name] for m in members if leaders[first] == m.address)
    print(
        f"""etcd     {cluster}  (pid {pids["etcd"]}, data {root / "etcd"})
haproxy  {proxy}  (pid {pids["haproxy"]}, config {root / "haproxy"})
sync     (pid {pids["haproxy-sync"]}, cluster haproxy-sync): HAProxy follows etcd's map
groups   {", ".join(leaders)}  (the shard map: sessionlog cluster map get --cluster {cluster})
{listing}
logs     {root}/*.log

Try it (in another terminal), through HAProxy:
  sessionlog append demo user_message --content "hi" --server {proxy}
  sessionlog cluster slot demo other    # each id's slot (crc32 mod 1024)
  sessionlog sessions --server {proxy}
  grpcurl -plaintext -H 'x-session-id: demo' -d '{{"session_id": "demo"}}' \\
    {proxy} sessionlog.v1.SessionLogService/GetSession
  kill -9 {leader_pid}   # {first}'s leader: only {first}'s sessions pause, the others go on

Ctrl-C stops every member, haproxy, then etcd.""",
        flush=True,
    )


def _print_group(
    root: Path, cluster: str, addresses: list[str], leader: str, pids: dict[str, int]
) -> None:
    members = ", ".join(f'"{a}"' for a in addresses)
    listing = "\n".join(
        f"  m{n}  {a}  pid {pids[f'm{n}']}{'  (leader)' if a == leader else ''}"
        for n, a in enumerate(addresses, 1)
    )
    leader_pid = next(pids[f"m{n}"] for n, a in enumerate(addresses, 1) if a == leader)
    print(
        f"""etcd     {cluster}  (pid {pids["etcd"]}, data {root / "etcd"})
group    {GROUP}  (--ack replica --sync-replicas 1)
{listing}
logs     {root}/*.log

Try it (in another terminal):
  sessionlog append demo user_message --content "hi" --server {leader}
  sessionlog replication status --server {addresses[0]}
  kill -9 {leader_pid}   # the leader: another member takes over within the lease TTL,
                        # and this one comes back as a follower 2 s later

From Python:
  from sessionlog_client import Client, event
  with Client([{members}]) as client:          # or Client(cluster="{cluster}", group="{GROUP}")
      client.append("demo", [event("user_message", {{"content": "hi"}})])

Ctrl-C stops every member, then etcd.""",
        flush=True,
    )


def _stop(name: str, process: subprocess.Popen[bytes]) -> None:
    """SIGTERM by PID, wait, SIGKILL if it does not exit."""
    if process.poll() is not None:
        return
    os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        print(f"{name} (pid {process.pid}) did not stop; killing it", file=sys.stderr)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(STOP_SECONDS)
