"""Case 10: Append with 16 clients through HAProxy, to one group and to two groups (issue 16).

Three runs of case 2 (16 concurrent clients, one event per call, each client to its own session),
all driven by h2load (one ``h2load -c1 -m1`` process per client, each sending its session's
``x-session-id`` header, as the clients do), on one deployment: two static groups, g1 and g2, of
one primary each (``sessionlog serve --shard-map FILE --group NAME``, the map in TOML, half the
slots each), and HAProxy in front, configured by ``sessionlog.shard.haproxy.write`` from that map
(the files ``sessionlog cluster haproxy`` writes):

a. **direct**: 16 sessions whose slots g1 owns, straight to g1's primary;
b. **via HAProxy, 1 group**: the same 16 sessions through HAProxy, whose frontend hashes the
   header to a slot, the slot to a group, and sends the Append to g1's write backend (the member
   that passes ``GET /primary``). b / a is what the proxy costs;
c. **via HAProxy, 2 groups**: 16 sessions picked by slot, 8 in g1 and 8 in g2, through HAProxy.
   c / b is what a second group brings on *this* machine, where both groups share the same CPUs
   (g2 idles through a and b, answering only HAProxy's health checks).

Each group is one ``sessionlog serve --workers 1`` with its ``--http-listen`` (HAProxy's health
checks) and ``--metrics-listen``; HAProxy runs in the foreground (``-db``) with its defaults (one
thread per CPU). Every process is started on free 127.0.0.1 ports and stopped by its PID. What is
checked, as for case 2 (h2load): every call HTTP 200, and each session, read before and after
on its owner's primary, grew by the calls h2load counted (or one more, in flight at its stop):
through the proxy that also proves every call reached the session's own group (a call routed to
the other group fails with WRONG_GROUP and stores nothing).

HAProxy's own cost: its CPU (``/proc/PID/stat`` utime + stime, all its threads) over the
measured run, per call, reported as milliseconds per 1,000 appends: the figure from which the
README works out, on paper, how far the proxy lets groups on separate machines scale.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench import cases, h2load
from bench.common import Measurement, Settings, append_request
from bench.load import UnaryLoad
from bench.procs import VENV_BIN, ChildProcess, ServerFailed, ServerProcess, free_port
from bench.report import Row
from sessionlog.shard import haproxy
from sessionlog.shard.shardmap import ShardMap
from sessionlog.shard.slots import SESSION_HEADER
from sessionlog.v1 import session_log_service_pb2 as pb

CASE = cases.AppendCase(10, clients=16, events_per_call=1)
"""16 concurrent clients, one event per call, as case 2; its sessions are ``h2-c10-...``."""
DIRECT = "direct"
VIA_ONE = "haproxy 1 group"
"""The kinds of the two rows: what their ceiling column holds."""
CHECK_SECONDS = 0.5
"""HAProxy's health-check interval here (its default is 1 s): the backends come up sooner."""
READY_TIMEOUT = 20.0
"""Seconds for HAProxy to pass a write to every group."""
INSTALL = "install it with `apt-get install -y haproxy` (or `make haproxy-tools` as root)"


def executable() -> str | None:
    """HAProxy's path: on PATH, or where Debian puts it (/usr/sbin is not on every PATH)."""
    found = shutil.which("haproxy")
    if found is None and os.access("/usr/sbin/haproxy", os.X_OK):
        found = "/usr/sbin/haproxy"
    return found


def unavailable() -> str:
    """Why this group cannot run here, or ""."""
    if executable() is None:
        return f"haproxy was not found; {INSTALL}"
    return h2load.unavailable()


def version() -> str:
    """The first line of ``haproxy -v`` ("HAProxy version 2.6.12-1 ..."), or ""."""
    return h2load.version_line(executable()).replace(" - https://haproxy.org/", "")


class HAProxyProcess(ChildProcess):
    """HAProxy in the foreground on one configuration, its output in ``log_path``."""

    def __init__(self, config: Path, log_path: Path) -> None:
        self.config = config
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> HAProxyProcess:
        path = executable()
        if path is None:
            raise RuntimeError(unavailable())
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [path, "-db", "-f", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self


@dataclass
class Groups:
    """Static groups of one primary each, their map, and HAProxy in front when asked for."""

    shard_map: ShardMap
    servers: dict[str, ServerProcess]
    """Group name -> its primary."""
    proxy: HAProxyProcess | None = None
    proxy_address: str = ""

    def owner(self, session_id: str) -> ServerProcess:
        return self.servers[self.shard_map.owner(session_id).name]

    def servers_cpu(self) -> float | None:
        """The CPU seconds of every group's server together (HAProxy's not included)."""
        seconds = [server.cpu_seconds() for server in self.servers.values()]
        return None if None in seconds else sum(s for s in seconds if s is not None)


@contextlib.contextmanager
def static_groups(work: Path, names: Sequence[str], proxy: bool) -> Iterator[Groups]:
    """One ``sessionlog serve --shard-map FILE --group NAME`` per name, the slots split evenly
    among them; with ``proxy``, HAProxy on the files ``haproxy.write`` makes from the map."""
    tag = "-".join(names)
    ports = {name: (free_port(), free_port(), free_port()) for name in names}
    shard_map = ShardMap.even_split(
        {name: [f"127.0.0.1:{grpc_port}"] for name, (grpc_port, _, _) in ports.items()},
        http={name: [f"127.0.0.1:{http_port}"] for name, (_, http_port, _) in ports.items()},
    )
    map_path = work / f"shards-{tag}.toml"
    map_path.write_text(shard_map.to_toml(), encoding="utf-8")
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, (grpc_port, http_port, metrics_port) in ports.items():
            argv = [
                str(VENV_BIN / "sessionlog"), "serve",
                "--data", str(work / f"shards-{tag}-{name}"),
                "--listen", f"127.0.0.1:{grpc_port}",
                "--http-listen", f"127.0.0.1:{http_port}",
                "--metrics-listen", f"127.0.0.1:{metrics_port}",
                "--workers", "1", "--log-level", "warning",
                "--shard-map", str(map_path), "--group", name,
            ]  # fmt: skip
            server = ServerProcess(
                f"sessionlog {name}", argv, grpc_port, work / f"shards-{tag}-{name}.log", 1,
                metrics_port,
            )  # fmt: skip
            stack.callback(server.stop)
            servers[name] = server
        with ThreadPoolExecutor(len(servers)) as starting:  # each waits for its own SERVING
            started = {name: starting.submit(server.start) for name, server in servers.items()}
        for name, future in started.items():
            if future.exception() is not None:
                raise ServerFailed(
                    f"group {name}: {future.exception()}\n{servers[name].log_tail()}"
                ) from None
        groups = Groups(shard_map, servers)
        if proxy:
            groups.proxy_address = f"127.0.0.1:{free_port()}"
            # HAProxy refuses a runtime-API socket path over 97 bytes, which a deep work folder
            # (a test's temporary folder) can reach: the socket goes in a short folder of its own.
            sockets = Path(tempfile.mkdtemp(prefix="slh-"))
            stack.callback(shutil.rmtree, sockets, ignore_errors=True)
            config, _ = haproxy.write(
                shard_map, work / f"haproxy-{tag}", groups.proxy_address, check=CHECK_SECONDS,
                socket=str(sockets / "haproxy.sock"),
            )  # fmt: skip
            groups.proxy = HAProxyProcess(config, work / f"haproxy-{tag}.log").start()
            stack.callback(groups.proxy.stop)
            _wait_routed(groups)
        yield groups


def _wait_routed(groups: Groups) -> None:
    """Until an empty Append (it writes nothing) through HAProxy reaches every group's primary,
    or fail within READY_TIMEOUT: the write backends are up once their checks pass."""
    assert groups.proxy is not None
    deadline = time.monotonic() + READY_TIMEOUT
    pending = {name: probe_session(groups.shard_map, name) for name in groups.servers}
    last = ""
    with grpc.insecure_channel(groups.proxy_address) as channel:
        while pending:
            if groups.proxy.process is None or groups.proxy.process.poll() is not None:
                raise ServerFailed(f"haproxy exited:\n{groups.proxy.log_tail()}")
            if time.monotonic() > deadline:
                raise ServerFailed(
                    f"haproxy did not reach group(s) {', '.join(pending)} within "
                    f"{READY_TIMEOUT:.0f} s (last: {last})\n{groups.proxy.log_tail()}"
                )
            for name, session in list(pending.items()):
                try:
                    next_seq(channel, session)
                except grpc.RpcError as error:
                    last = f"{error.code().name}: {error.details()}"
                    continue
                del pending[name]
            if pending:
                time.sleep(0.1)


def probe_session(shard_map: ShardMap, group: str) -> str:
    """A session id that ``group`` owns (not one the case appends to)."""
    return next(f"probe-{i}" for i in range(10_000) if shard_map.owner(f"probe-{i}").name == group)


def next_seq(channel: grpc.Channel, session_id: str) -> int:
    """The session's next seq, read with an empty Append carrying the routing header."""
    raw = channel.unary_unary(cases.APPEND)(
        pb.AppendRequest(session_id=session_id).SerializeToString(),
        timeout=30,
        metadata=((SESSION_HEADER, session_id),),
    )
    return int(pb.AppendResponse.FromString(raw).next_seq)


def spread_sessions(
    shard_map: ShardMap, clients: int, names: Sequence[str] | None = None
) -> list[str]:
    """``clients`` session ids ``h2-c10-<i>`` spread evenly (by slot) over the groups ``names``
    (default: every group of the map), alternating group by group."""
    names = [group.name for group in shard_map.groups] if names is None else list(names)
    share = {
        name: clients // len(names) + (i < clients % len(names)) for i, name in enumerate(names)
    }
    picked: dict[str, list[str]] = {name: [] for name in names}
    for i in range(100_000):
        session = f"{CASE.h2load_prefix}-{i}"
        owner = shard_map.owner(session).name
        if owner in picked and len(picked[owner]) < share[owner]:
            picked[owner].append(session)
        if sum(map(len, picked.values())) == clients:
            break
    rounds = max(len(found) for found in picked.values())
    return [picked[name][k] for k in range(rounds) for name in names if k < len(picked[name])]


def run_append(
    settings: Settings, groups: Groups, sessions: list[str], target: str, name: str, work: Path
) -> Measurement:
    """One h2load run of the case against ``target`` (a primary or HAProxy), each client to its
    own session with its ``x-session-id``; then the check of the stored events."""
    load = UnaryLoad(
        target=target,
        method=cases.APPEND,
        requests=tuple(append_request(session, CASE.events_per_call) for session in sessions),
        events_per_call=CASE.events_per_call,
        duration=settings.workers_duration or settings.duration,
        warmup=settings.warmup,
        max_calls=settings.max_calls_per_client,
        processes=len(sessions),
        headers=tuple(f"{SESSION_HEADER}: {session}" for session in sessions),
    )
    h2load.warm_up(load, work)
    before = stored(groups, sessions)
    proxy_cpu: Callable[[], float | None] = (
        (lambda: None) if groups.proxy is None else groups.proxy.cpu_seconds
    )
    proxy_before = proxy_cpu()
    outcome = h2load.measure(load, name, groups.servers_cpu, work)
    proxy_after = proxy_cpu()
    after = stored(groups, sessions)
    measurement = outcome.measurement
    for index, session in enumerate(sessions):
        grown = after[index] - before[index]
        counted = outcome.succeeded.get(index, 0) * CASE.events_per_call
        if not counted <= grown <= counted + CASE.events_per_call:
            measurement.errors += 1
            measurement.first_error = measurement.first_error or (
                f"session {session}: h2load counted {counted} events as succeeded, but "
                f"{grown} were stored in its group {groups.shard_map.owner(session).name} "
                "(a gRPC error, WRONG_GROUP included, is an HTTP 200)"
            )
    per_group = {
        group: sum(groups.shard_map.owner(s).name == group for s in sessions)
        for group in groups.servers
    }
    measurement.details.update(
        groups=sum(count > 0 for count in per_group.values()),
        via=("haproxy" if groups.proxy is not None and target == groups.proxy_address else DIRECT),
        sessions_per_group=per_group,
        stored_events_per_client=[a - b for a, b in zip(after, before, strict=True)],
    )
    if proxy_before is not None and proxy_after is not None and target == groups.proxy_address:
        cpu = proxy_after - proxy_before
        measurement.details.update(
            haproxy_cpu_seconds=cpu,
            haproxy_cores=cpu / measurement.seconds if measurement.seconds > 0 else None,
            haproxy_us_per_call=cpu / measurement.calls * 1e6 if measurement.calls else None,
        )
    return measurement


def stored(groups: Groups, sessions: list[str]) -> list[int]:
    """Each session's next seq, read on its owner's primary."""
    found = []
    for session in sessions:
        with grpc.insecure_channel(groups.owner(session).address) as channel:
            found.append(next_seq(channel, session))
    return found


def run_group(settings: Settings, work: Path, progress: Callable[[str], None]) -> list[Row]:
    """Runs a, b and c on one deployment (groups g1 and g2, HAProxy in front); the rows b beside
    a (kind DIRECT) and c beside b (kind VIA_ONE)."""
    label = "append 1 ev/call, 16 clients"
    with static_groups(work, ["g1", "g2"], proxy=True) as deployed:
        in_g1 = spread_sessions(deployed.shard_map, CASE.clients, ["g1"])
        progress(f"case 10 {label}: direct to group g1's primary (h2load)")
        primary = deployed.servers["g1"].address
        direct = run_append(settings, deployed, in_g1, primary, f"{label}, direct", work)
        _progress(progress, direct)
        progress(f"case 10 {label}: through HAProxy, every session in g1 (h2load)")
        proxy = deployed.proxy_address
        via_one = run_append(settings, deployed, in_g1, proxy, f"{label}, haproxy, 1 group", work)
        _progress(progress, via_one)
        in_both = spread_sessions(deployed.shard_map, CASE.clients)
        progress(f"case 10 {label}: through HAProxy, 8 sessions in g1 and 8 in g2 (h2load)")
        via_two = run_append(
            settings, deployed, in_both, proxy, f"{label}, haproxy, 2 groups", work
        )
        _progress(progress, via_two)
    return [
        Row(f"10 shards: {label}, haproxy/direct", via_one, direct, DIRECT),
        Row(f"10 shards: {label}, 2 groups/1", via_two, via_one, VIA_ONE),
    ]


def _progress(progress: Callable[[str], None], measurement: Measurement) -> None:
    proxy = measurement.details.get("haproxy_us_per_call")
    extra = "" if proxy is None else f", haproxy {proxy:.0f} ms CPU per 1,000 appends"
    errors = f", {measurement.errors} errors" if measurement.errors else ""
    progress(f"  {measurement.events_per_second:,.0f} appends/s{extra}{errors}")
