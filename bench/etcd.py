"""The etcd peer: Debian's etcd-server 3.4, started by the bench on loopback, driven by h2load.

etcd is what a user would pick instead of sessionlog for a durable, replicated log with watches:
a key's history of revisions is a log, a Txn writes several keys at one revision, and a Range with
a limit reads a page of a prefix. It runs as a single member with its default durability (every
write is in its WAL, fsynced, before the reply; the bbolt backend commits behind it), its data
dir in the run's temp dir, on free 127.0.0.1 ports, stopped by its PID.

The load client is the same h2load as sessionlog's ``(h2load)`` rows (``bench.h2load``): one
``h2load -c1 -m1`` process per client, each POSTing its own gRPC frame over h2c. The requests are
built from etcd's own message definitions (the subset below, field numbers from etcd's protos), so
the bench needs no etcd client library. What each row is:

- ``Put``: client i puts one small value (the stored benchmark event, the bytes sessionlog stores
  per event) to its own key ``bench/put/<i>/000``, over and over. Every Put writes a new revision of
  that key (etcd keeps every revision until a compaction, and the bench compacts nothing), so a
  key is a client's log, as a session is.
- ``Txn``: client i sends a Txn of 100 Puts to its own 100 keys (a Txn may not write one key
  twice, and etcd allows at most 128 operations in one): 100 values at one new revision.
- ``Range``: every client reads the last page of one log of ``page_log_events`` keys (keys
  ``bench/log/<seq>``, zero-padded so that key order is seq order): ``key`` = the page's first
  key, ``range_end`` = the prefix's end, ``limit`` = the page size. Linearizable, etcd's default.

What is checked. h2load sees HTTP, not gRPC (an etcd error is an HTTP 200 with a grpc-status
trailer), so besides h2load's own counts (``bench.h2load``) the store is read afterwards:

- writes: etcd's revision (a Range's header) must grow over the measured run by exactly the
  calls that were applied, each client's key (every key of its Txn) by the calls h2load counted
  as succeeded or one more (the call in flight when h2load stops is applied but not counted),
  and every key of one client's Txn must be at the same version (a Txn is atomic);
- reads: every client must have received exactly the bytes of its succeeded calls' replies (the
  reply is read once beforehand; nothing writes during the run, so each reply is the same), or
  up to one reply more (the call in flight at the stop); an error reply is shorter and shows.

When ``etcd`` or h2load is missing, these rows are skipped with a note.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from bench import h2load
from bench.common import Measurement, Settings, page_events, stored_event
from bench.load import UnaryLoad
from bench.procs import ChildProcess, free_port
from sessionlog.cluster.etcd import etcd_command

START_SECONDS = 30.0
CALL_TIMEOUT = 30.0
INSTALL = "install it with `apt-get install -y etcd-server` (or `make bench-tools` as root)"
KV = "/etcdserverpb.KV"
PUT = f"{KV}/Put"
TXN = f"{KV}/Txn"
RANGE = f"{KV}/Range"
PUT_PREFIX = b"bench/put/"
TXN_PREFIX = b"bench/txn/"
LOG_PREFIX = b"bench/log/"
FILL_PUTS = 100
"""Puts per Txn while filling the log the Range rows read (etcd's --max-txn-ops is 128)."""

# -- etcd's messages ----------------------------------------------------------------------------
#
# The subset of etcd's v3 API the bench sends or reads, with etcd v3.4's field numbers: from
# etcdserver/etcdserverpb/rpc.proto (ResponseHeader, RangeRequest, RangeResponse, PutRequest,
# PutResponse, RequestOp, TxnRequest, TxnResponse) and mvcc/mvccpb/kv.proto (KeyValue). Those
# files import gogoproto and google.api annotations, which this project does not have, so the
# messages are declared here, field by field; a field not declared is skipped when parsing a
# reply. RequestOp's ``request_put`` belongs to a oneof in etcd's proto; a oneof member is
# encoded as a plain field, which is all a request needs.

_BYTES = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
_INT64 = descriptor_pb2.FieldDescriptorProto.TYPE_INT64
_BOOL = descriptor_pb2.FieldDescriptorProto.TYPE_BOOL
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL

_FIELDS: dict[str, list[tuple[str, int, Any, bool]]] = {
    # name: [(field, number, scalar type or message name, repeated)]
    "ResponseHeader": [("revision", 3, _INT64, False)],
    "KeyValue": [
        ("key", 1, _BYTES, False),
        ("create_revision", 2, _INT64, False),
        ("mod_revision", 3, _INT64, False),
        ("version", 4, _INT64, False),
        ("value", 5, _BYTES, False),
    ],
    "RangeRequest": [
        ("key", 1, _BYTES, False),
        ("range_end", 2, _BYTES, False),
        ("limit", 3, _INT64, False),
        ("count_only", 9, _BOOL, False),
    ],
    "RangeResponse": [
        ("header", 1, "ResponseHeader", False),
        ("kvs", 2, "KeyValue", True),
        ("more", 3, _BOOL, False),
        ("count", 4, _INT64, False),
    ],
    "PutRequest": [("key", 1, _BYTES, False), ("value", 2, _BYTES, False)],
    "PutResponse": [("header", 1, "ResponseHeader", False)],
    "RequestOp": [("request_put", 2, "PutRequest", False)],
    "TxnRequest": [("success", 2, "RequestOp", True)],
    "TxnResponse": [("header", 1, "ResponseHeader", False), ("succeeded", 2, _BOOL, False)],
}


def _message_classes() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(
        name="bench/etcdserverpb_subset.proto", package="etcdserverpb", syntax="proto3"
    )
    for name, fields in _FIELDS.items():
        message = proto.message_type.add(name=name)
        for field, number, kind, repeated in fields:
            declared = message.field.add(
                name=field, number=number, label=_REPEATED if repeated else _OPTIONAL
            )
            if isinstance(kind, str):
                declared.type = _MESSAGE
                declared.type_name = f".etcdserverpb.{kind}"
            else:
                declared.type = kind
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"etcdserverpb.{name}"))
        for name in _FIELDS
    }


_API = _message_classes()


def put_request(key: bytes, value: bytes) -> bytes:
    serialized: bytes = _API["PutRequest"](key=key, value=value).SerializeToString()
    return serialized


def txn_request(puts: list[tuple[bytes, bytes]]) -> bytes:
    """A Txn with no comparisons (so it succeeds) whose success branch is these Puts."""
    ops = [_API["RequestOp"](request_put=_API["PutRequest"](key=k, value=v)) for k, v in puts]
    serialized: bytes = _API["TxnRequest"](success=ops).SerializeToString()
    return serialized


def range_request(
    key: bytes, range_end: bytes = b"", limit: int = 0, count_only: bool = False
) -> bytes:
    request = _API["RangeRequest"](key=key, range_end=range_end, limit=limit, count_only=count_only)
    serialized: bytes = request.SerializeToString()
    return serialized


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a Range cover every key starting with ``prefix``."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def revision(channel: grpc.Channel) -> int:
    """etcd's current revision (from the header of a Range that counts nothing)."""
    reply = _range(channel, range_request(b"\0", b"\0", count_only=True))
    return int(reply.header.revision)


def versions(channel: grpc.Channel, prefix: bytes) -> dict[bytes, int]:
    """Each key under ``prefix`` with its version (the Puts it has had since it was created)."""
    reply = _range(channel, range_request(prefix, prefix_end(prefix)))
    return {bytes(kv.key): int(kv.version) for kv in reply.kvs}


def key_count(channel: grpc.Channel, prefix: bytes) -> int:
    """How many keys there are under ``prefix``."""
    reply = _range(channel, range_request(prefix, prefix_end(prefix), count_only=True))
    return int(reply.count)


def _range(channel: grpc.Channel, request: bytes) -> Any:
    raw = channel.unary_unary(RANGE)(request, timeout=CALL_TIMEOUT)
    return _API["RangeResponse"].FromString(raw)


# -- the server ---------------------------------------------------------------------------------


def executable() -> str | None:
    return shutil.which("etcd")


def unavailable() -> str:
    """Why the etcd rows cannot run here, or "" when they can."""
    if executable() is None:
        return f"etcd was not found on PATH; {INSTALL}"
    return h2load.unavailable()


def version() -> str:
    """What ``etcd --version`` says first, e.g. "etcd Version: 3.4.23"; "" when it cannot say."""
    return h2load.version_line(executable())


class EtcdProcess(ChildProcess):
    """One single-member etcd on 127.0.0.1 (client and peer ports free), stopped by its PID."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.peer_port = free_port()
        self.log_path = directory / "etcd.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> EtcdProcess:
        path = executable()
        if path is None:
            raise RuntimeError(unavailable())
        self.directory.mkdir(parents=True, exist_ok=True)
        argv, env = etcd_command(path, "bench", self.directory / "data", self.port, self.peer_port)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        try:
            self._wait_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_serving(self) -> None:
        """Until a Range answers (the member has elected itself leader), or fail."""
        assert self.process is not None
        deadline = time.monotonic() + START_SECONDS
        with grpc.insecure_channel(self.address) as channel:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"etcd exited with {self.process.returncode}:\n{self.log_tail()}"
                    )
                try:
                    channel.unary_unary(RANGE)(
                        range_request(b"\0", b"\0", count_only=True), timeout=1.0
                    )
                    return
                except grpc.RpcError:
                    time.sleep(0.05)
        raise RuntimeError(f"etcd not answering within {START_SECONDS:.0f} s:\n{self.log_tail()}")


@contextlib.contextmanager
def etcd_server(directory: Path) -> Iterator[EtcdProcess]:
    """etcd in ``directory``, stopped on exit. A start that fails (say, a port taken between
    choosing it and binding it) is tried again, twice, on new ports in a fresh folder."""
    attempts = 3
    for attempt in range(attempts):
        try:
            server = EtcdProcess(directory / f"start-{attempt}").start()
            break
        except RuntimeError:
            if attempt == attempts - 1:
                raise
    try:
        yield server
    finally:
        server.stop()


# -- the rows -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteCase:
    """``clients`` h2load clients, each sending ``puts_per_call`` Puts per call to its own keys."""

    clients: int
    puts_per_call: int
    in_flight: int = 1
    """Calls each client keeps in flight on its connection (h2load's ``-m``)."""

    @property
    def label(self) -> str:
        what = "Put 1 key" if self.puts_per_call == 1 else f"Txn of {self.puts_per_call} Puts"
        plural = "s" if self.clients > 1 else ""
        window = f" x {self.in_flight} in flight" if self.in_flight > 1 else ""
        return f"etcd {what}, {self.clients} client{plural}{window} (h2load)"


PUTS = WriteCase(clients=16, puts_per_call=1)
"""Beside case 2: 16 clients, one event (one Put) per call."""
TXNS = WriteCase(clients=4, puts_per_call=100)
"""Beside case 3: 4 clients, 100 events (a Txn of 100 Puts) per call."""


def pipelined_puts(in_flight: int) -> WriteCase:
    """Beside case 13's AppendStream of one event: 16 clients, each keeping ``in_flight`` Puts
    in flight, as each stream keeps that many appends."""
    return WriteCase(clients=16, puts_per_call=1, in_flight=in_flight)


PAGE_CLIENTS = 4
"""h2load clients of the Range page row (and of sessionlog's Since page row beside it)."""


def _client_prefix(case: WriteCase, index: int) -> bytes:
    """Client ``index``'s keys are ``<prefix><nnn>``: one for a Put, 100 for a Txn of 100."""
    return (PUT_PREFIX if case.puts_per_call == 1 else TXN_PREFIX) + b"%d/" % index


def write_load(settings: Settings, server: EtcdProcess, case: WriteCase) -> UnaryLoad:
    value = stored_event(1000)
    requests = []
    for index in range(case.clients):
        keys = [_client_prefix(case, index) + b"%03d" % n for n in range(case.puts_per_call)]
        if case.puts_per_call == 1:
            requests.append(put_request(keys[0], value))
        else:
            requests.append(txn_request([(key, value) for key in keys]))
    method = PUT if case.puts_per_call == 1 else TXN
    load = UnaryLoad.for_run(
        settings, server.address, method, tuple(requests), case.puts_per_call, case.clients
    )
    return replace(load, in_flight=case.in_flight)


def run_writes(settings: Settings, server: EtcdProcess, case: WriteCase, work: Path) -> Measurement:
    """h2load sends the case's Puts or Txns; then the revision and every key's version are
    checked against what h2load counted."""
    load = write_load(settings, server, case)
    h2load.warm_up(load, work)
    with grpc.insecure_channel(server.address) as channel:
        before_revision = revision(channel)
        before = [versions(channel, _client_prefix(case, i)) for i in range(case.clients)]
    outcome = h2load.measure(load, case.label, server.cpu_seconds, work)
    measurement = outcome.measurement
    with grpc.insecure_channel(server.address) as channel:
        after = [versions(channel, _client_prefix(case, i)) for i in range(case.clients)]
        after_revision = revision(channel)
    applied = []
    problems = []
    for index in range(case.clients):
        grown = {key: after[index].get(key, 0) - before[index].get(key, 0) for key in after[index]}
        counts = set(grown.values())
        if len(grown) != case.puts_per_call or len(counts) != 1:
            problems.append(
                f"client {index}: {len(grown)} keys written, growing by {sorted(counts)} "
                f"(expected {case.puts_per_call} keys, all alike)"
            )
            applied.append(max(counts, default=0))
            continue
        calls = counts.pop()
        applied.append(calls)
        counted = outcome.succeeded.get(index, 0)
        if not counted <= calls <= counted + case.in_flight:
            problems.append(
                f"client {index}: h2load counted {counted} calls as succeeded, but {calls} "
                "were applied (an etcd error is an HTTP 200)"
            )
    if after_revision - before_revision != sum(applied):
        problems.append(
            f"etcd's revision grew by {after_revision - before_revision}, but the keys show "
            f"{sum(applied)} applied calls"
        )
    if problems:
        measurement.errors += len(problems)
        measurement.first_error = measurement.first_error or problems[0]
    measurement.details.update(
        peer="etcd",
        puts_per_call=case.puts_per_call,
        in_flight=case.in_flight,
        applied_calls_per_client=applied,
        revision_growth=after_revision - before_revision,
    )
    return measurement


def fill_log(server: EtcdProcess, count: int) -> None:
    """Put ``count`` stored benchmark events under ``bench/log/`` in Txns (untimed setup; a
    second fill writes new revisions of the same keys)."""
    with grpc.insecure_channel(server.address) as channel:
        txn = channel.unary_unary(TXN)
        written = 0
        while written < count:
            seqs = range(written, min(count, written + FILL_PUTS))
            txn(txn_request([(log_key(seq), stored_event(seq)) for seq in seqs]), timeout=60)
            written += len(seqs)
        stored = key_count(channel, LOG_PREFIX)
    if stored != count:
        raise RuntimeError(f"etcd's log holds {stored} keys, expected {count}")


def log_key(seq: int) -> bytes:
    return LOG_PREFIX + b"%010d" % seq


def run_range_pages(
    settings: Settings, server: EtcdProcess, clients: int, log_events: int, work: Path
) -> Measurement:
    """Fill a log of ``log_events`` keys, then have h2load read its last page over and over."""
    fill_log(server, log_events)
    page = min(page_events(), log_events)
    request = range_request(log_key(log_events - page), prefix_end(LOG_PREFIX), limit=page)
    with grpc.insecure_channel(server.address) as channel:
        raw = channel.unary_unary(RANGE)(request, timeout=CALL_TIMEOUT)
    reply = _API["RangeResponse"].FromString(raw)
    if len(reply.kvs) != page or reply.more:
        raise RuntimeError(f"etcd's last page holds {len(reply.kvs)} keys, expected {page}")
    load = UnaryLoad.for_run(settings, server.address, RANGE, (request,) * clients, page, clients)
    name = (
        f"etcd Range page of {page:,} keys, {clients} client{'s' if clients > 1 else ''} (h2load)"
    )
    h2load.warm_up(load, work)
    outcome = h2load.measure(load, name, server.cpu_seconds, work)
    h2load.check_replies(outcome, len(h2load.frame(raw)))
    measurement = outcome.measurement
    measurement.details.update(peer="etcd", page_events=page, log_events=log_events)
    return measurement
