"""A group of `sessionlog serve --cluster` processes and their etcd, for the failover tests.

    with Group(tmp_path, members=3) as group:        # etcd + 3 members, a leader elected
        group.leader()                                 # (Member, epoch) as etcd says now
        member.kill(); member.start()                  # SIGKILL by PID, same folder and port
        member.freeze(); member.thaw()                 # SIGSTOP / SIGCONT
        member.etcd_link.blackhole(True)               # cut off from etcd (its relay)
        group.etcd.stop(); group.etcd.start()          # an etcd restart, data kept

Every member reaches etcd through a relay of its own (``tests.e2e._relay``), so one member can
be partitioned from etcd while the others and the clients still reach it. Clients and the other
members reach a member at its advertise address: its listen address, or with ``fronts`` a relay
in front of it (``member.front``), which can cut the other members (who dial the advertised
address) off from it while a test still reaches it directly (``member.direct``). Every process
is stopped by its PID when the group closes.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from sessionlog.cluster.election import read_leader
from sessionlog.cluster.etcd import Endpoints, EtcdError, EtcdUnavailable
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import replication_service_pb2_grpc as rpb_grpc
from tests.cluster._etcd import EtcdProcess
from tests.e2e._proc import ServerProcess, clean_env, free_port, health_status
from tests.e2e._relay import Relay

GROUP = "g"
SERVING = health_pb2.HealthCheckResponse.SERVING
ELECTION_SECONDS = 60.0
"""How long a test waits for an election or for the group to heal. An election takes about a
lease TTL on a quiet machine and several on a busy one; tests wait for the event itself and only
give up after this long, so a slow election fails nothing. How fast failover is gets measured
and printed (test_failover), not made a pass/fail budget."""


class Member:
    """One `sessionlog serve --cluster` process: its folder, port and etcd relay."""

    def __init__(
        self,
        root: Path,
        name: str,
        etcd_port: int,
        args: list[str],
        front: bool = False,
        http: bool = False,
        metrics: bool = False,
    ) -> None:
        self.root = root
        self.name = name
        self.port = free_port()
        self.http = f"127.0.0.1:{free_port()}" if http else ""
        """Its --http-listen address ("" without one)."""
        self.metrics = f"127.0.0.1:{free_port()}" if metrics else ""
        """Its --metrics-listen address ("" without one)."""
        self.data = root / name
        self.etcd_link = Relay(etcd_port).start()
        self.front = Relay(self.port).start() if front else None
        self.args = args
        self.process: ServerProcess | None = None
        self.frozen = False
        self.starts = 0

    @property
    def direct(self) -> str:
        """Where it listens."""
        return f"127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        """Where it says it is (--advertise): what etcd names, the others dial, clients use."""
        return self.direct if self.front is None else self.front.address

    @property
    def running(self) -> bool:
        return (
            self.process is not None
            and self.process.process is not None
            and (self.process.process.poll() is None)
        )

    def start(self) -> Member:
        args = [
            "--data", str(self.data),
            "--listen", self.direct,
            "--advertise", self.address,
            "--cluster", f"etcd://{self.etcd_link.address}",
            "--group", GROUP,
            "--log-format", "json",
            *(["--http-listen", self.http] if self.http else []),
            *(["--metrics-listen", self.metrics] if self.metrics else []),
            *self.args,
        ]  # fmt: skip
        env = clean_env(workers=False)
        self.process = ServerProcess(args, self.root, env=env, name=self.name).start()
        self.frozen = False
        self.starts += 1
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.thaw()
        self.process.kill()

    def stop(self) -> None:
        if self.process is not None and self.running:
            self.thaw()
            self.process.stop()

    def freeze(self) -> None:
        assert self.process is not None
        self.process.signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.frozen and self.process is not None:
            self.process.signal(signal.SIGCONT)
        self.frozen = False

    def log(self) -> str:
        return "" if self.process is None else self.process.log()

    def health(self) -> int | None:
        return health_status(self.direct, timeout=0.5)

    def status(self, timeout: float = 2.0) -> rpb.GetReplicationStatusResponse | None:
        try:
            with grpc.insecure_channel(self.direct) as channel:
                stub = rpb_grpc.ReplicationServiceStub(channel)  # type: ignore[no-untyped-call]
                reply: rpb.GetReplicationStatusResponse = stub.GetReplicationStatus(
                    rpb.GetReplicationStatusRequest(), timeout=timeout
                )
                return reply
        except grpc.RpcError:
            return None

    def close(self) -> None:
        self.stop()
        self.etcd_link.stop()
        if self.front is not None:
            self.front.stop()


class Group:
    """etcd and the members of one group; see the module docstring."""

    def __init__(
        self,
        root: Path,
        members: int = 3,
        args: list[str] | None = None,
        fronts: bool = False,
        http: bool = False,
        metrics: bool = False,
    ) -> None:
        self.root = root
        self.http = http
        """Each member with a --http-listen of its own (``member.http``)."""
        self.metrics = metrics
        """Each member with a --metrics-listen of its own (``member.metrics``)."""
        self.etcd = EtcdProcess(root / "etcd")
        self.member_args = args or []
        self.members: list[Member] = []
        self.count = members
        self.fronts = fronts
        self._endpoints: Endpoints | None = None

    @property
    def cluster(self) -> str:
        """The etcd endpoint clients use (directly, not through a member's relay)."""
        return f"etcd://{self.etcd.endpoint}"

    @property
    def addresses(self) -> list[str]:
        return [m.address for m in self.members]

    def start(self) -> Group:
        self.etcd.start()
        self._endpoints = Endpoints((self.etcd.endpoint,), 1.0)
        for index in range(self.count):
            member = Member(
                self.root,
                f"m{index + 1}",
                self.etcd.port,
                self.member_args,
                self.fronts,
                self.http,
                self.metrics,
            )
            self.members.append(member)
            member.start()
        self.wait_healthy()
        return self

    def by_address(self, address: str) -> Member:
        return next(m for m in self.members if m.address == address)

    def leader(self) -> tuple[Member, int] | None:
        """The leader etcd names now (None: none, or etcd unreachable)."""
        assert self._endpoints is not None
        try:
            found = read_leader(self._endpoints, GROUP)
        except (EtcdUnavailable, EtcdError):
            return None
        if found is None:
            return None
        return self.by_address(found[0]), found[1]

    def healthy(self) -> tuple[Member, int] | None:
        """The leader when the whole group is well: etcd names it, it is SERVING, and every
        other member is SERVING too (it replicates the leader and has caught up)."""
        found = self.leader()
        if found is None or not all(m.running and not m.frozen for m in self.members):
            return None
        if all(m.health() == SERVING for m in self.members):
            return found
        return None

    def wait_healthy(self, timeout: float = ELECTION_SECONDS) -> tuple[Member, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.healthy()
            if found is not None:
                return found
            time.sleep(0.05)
        raise AssertionError(
            f"the group is not healthy within {timeout} s: leader {self.leader()}, health "
            f"{[(m.name, m.health()) for m in self.members]}\n{self.logs()}"
        )

    def wait_new_leader(self, above: int, timeout: float = ELECTION_SECONDS) -> tuple[Member, int]:
        """The first leader etcd names at an epoch above ``above``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.leader()
            if found is not None and found[1] > above:
                return found
            time.sleep(0.02)
        raise AssertionError(f"no leader above epoch {above} within {timeout} s\n{self.logs()}")

    def logs(self, lines: int = 25) -> str:
        out = []
        for member in self.members:
            tail = "\n".join(member.log().splitlines()[-lines:])
            out.append(f"--- {member.name} ({member.address}) ---\n{tail}")
        return "\n".join(out)

    def close(self) -> None:
        for member in self.members:
            member.close()
        if self._endpoints is not None:
            self._endpoints.close()
        self.etcd.stop()

    def __enter__(self) -> Group:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def log_entries(member: Member) -> list[dict[str, Any]]:
    """The JSON lines a member's log holds (every run of its process)."""
    import json

    out = []
    for line in member.log().splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out
