"""What every benchmark shares: run settings, the events sent, and how a result is recorded."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.struct_pb2 import Struct

from sessionlog import wire
from sessionlog.v1 import event_pb2, session_log_service_pb2

#: The Since server sends batches of stored events until they reach this many bytes.
SINCE_BATCH_BYTES = 256 << 10
#: The content of every benchmark event: a realistic small user message.
CONTENT = "hello world, this is a message of moderate length"


@dataclass(frozen=True)
class Settings:
    """How long and how hard to run. ``quick`` trades precision for a run under two minutes."""

    duration: float
    """Measured seconds of each time-bounded case (unary loads, LMDB commits)."""
    warmup: float
    """Seconds of calls before measuring (connections up, code paths warm)."""
    client_processes: int
    """Processes the concurrent load is spread over (each runs asyncio tasks)."""
    since_events: int
    """Events stored for the Since catch-up case."""
    since_runs: int
    """Timed Since reads (after one untimed); the median is reported."""
    max_calls_per_client: int = 1_000_000
    """Hard bound on calls per client, whatever the duration."""
    budget_seconds: float = 600.0
    """The whole run is aborted past this."""
    tail_followers: tuple[int, ...] = (1, 100)
    """Follower counts of the live-tail case."""
    workers_duration: float | None = None
    """Measured seconds of each case of the ``--workers`` group (None: ``duration``); shorter by
    default, so that the group fits the run's budget."""
    derive_restarts: int = 1
    """Server starts of the DeriveMessages case (one cold call per session per start)."""
    derive_calls: int = 10
    """Memoized DeriveMessages calls per session."""
    derive_appends: int = 5
    """Append-then-derive rounds per session."""
    redis_events: int = 100_000
    """Entries in the stream the Redis XRANGE catch-up reads."""
    page_log_events: int = 30_000
    """Events in the log whose last page the paged-read rows read (a sessionlog session and
    an etcd prefix of as many keys)."""
    sessions_count: int = 10_000
    """Sessions the many-sessions case writes (and then lists)."""
    sessions_events: int = 100
    """Events in each of those sessions, written by one Append."""
    sessions_fill_clients: int = 16
    """Concurrent Appends while filling them (untimed setup)."""
    sessions_list_passes: int = 3
    """Timed ListSessions passes over all of them, per page size."""
    last_events: int = 1_000_000
    """Events in the session the reads-from-the-end case reads the last of."""
    last_fill_seconds: float = 240.0
    """Writing that session stops at the batch that passes this (its size is then reported)."""
    last_full_calls: int = 3
    """Repeated reads of the whole log (Since from 0, a full DeriveMessages) for warm figures."""
    frameworks_calls: int = 200
    """Timed calls of each framework call on each store (case 12), after a few untimed."""
    frameworks_whole_calls: int = 5
    """Timed whole-history reads and list_sessions calls of case 12."""
    frameworks_items: int = 20_000
    """Items in the OpenAI Agents SDK session case 12 reads the last 20 of and whole."""
    frameworks_sessions: int = 5_000
    """Sessions of one user that case 12's ADK list_sessions lists."""
    stream_window: int = 16
    """Appends each AppendStream stream keeps in flight (case 13, ``bench.streams``)."""
    delete_events: int = 1_000_000
    """Events case 14 deletes while others append, in all: ``delete_sessions`` long sessions of
    an equal share."""
    delete_sessions: int = 6
    """Long sessions case 14 deletes one after another, each followed by as long a quiet span."""

    @classmethod
    def default(cls) -> Settings:
        return cls(
            duration=10.0,
            warmup=1.0,
            client_processes=2,
            since_events=100_000,
            since_runs=5,
            budget_seconds=600.0,
            workers_duration=5.0,
            derive_restarts=3,
            derive_calls=30,
            derive_appends=10,
        )

    @classmethod
    def quick(cls) -> Settings:
        return cls(
            duration=2.5,
            warmup=0.5,
            client_processes=2,
            since_events=100_000,
            since_runs=3,
            budget_seconds=150.0,
            workers_duration=1.5,
            sessions_count=2_000,
            sessions_list_passes=2,
            last_events=50_000,
            last_fill_seconds=30.0,
            last_full_calls=1,
            frameworks_calls=100,
            frameworks_whole_calls=3,
            frameworks_items=5_000,
            frameworks_sessions=1_000,
            delete_events=200_000,
        )


def event(seq: int = 0, time_ns: int | None = None) -> event_pb2.Event:
    """The benchmark event: a USER_MESSAGE with one string of moderate length."""
    data = Struct()
    data.update({"content": CONTENT})
    message = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE, data=data, seq=seq)
    if time_ns is not None:
        message.time.FromNanoseconds(time_ns)
    return message


def append_request(session_id: str, events_per_call: int) -> bytes:
    """A serialized AppendRequest carrying ``events_per_call`` benchmark events (no time set)."""
    request = session_log_service_pb2.AppendRequest(
        session_id=session_id, events=[event()] * events_per_call
    )
    serialized: bytes = request.SerializeToString()
    return serialized


def stored_event(seq: int) -> bytes:
    """The benchmark event as the server stores it: with its seq and a server timestamp."""
    serialized: bytes = event(seq, time_ns=1_767_225_600_123_456_789).SerializeToString()
    return serialized


def page_events() -> int:
    """Stored benchmark events in one Since batch: the page the paged-read rows read."""
    return max(1, SINCE_BATCH_BYTES // len(stored_event(1000)))


def since_batches(events: Sequence[bytes], budget: int = SINCE_BATCH_BYTES) -> list[bytes]:
    """SinceResponse messages grouped as the server groups them: each batch grows until it
    reaches ``budget`` bytes of events."""
    out: list[bytes] = []
    batch: list[bytes] = []
    size = 0
    for raw in events:
        batch.append(raw)
        size += len(raw)
        if size >= budget:
            out.append(wire.length_delimited(1, batch))
            batch, size = [], 0
    if batch:
        out.append(wire.length_delimited(1, batch))
    return out


def _batch_class() -> Any:
    """A message shaped like SinceResponse but with ``events`` as opaque bytes.

    Parsing with it counts a response's events in C without decoding them, so counting costs the
    client almost nothing, identically for sessionlog and the echo ceiling.
    """
    proto = descriptor_pb2.FileDescriptorProto(
        name="bench/since_batch.proto", package="bench", syntax="proto3"
    )
    message = proto.message_type.add(name="SinceBatch")
    kinds = descriptor_pb2.FieldDescriptorProto
    message.field.add(name="events", number=1, type=kinds.TYPE_BYTES, label=kinds.LABEL_REPEATED)
    message.field.add(name="caught_up", number=2, type=kinds.TYPE_BOOL)
    message.field.add(name="next_seq", number=3, type=kinds.TYPE_UINT64)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.SinceBatch"))


_SinceBatch = _batch_class()


def count_events(response: bytes) -> int:
    """How many ``events`` a serialized SinceResponse holds."""
    return len(_SinceBatch.FromString(response).events)


def system_cpu_seconds() -> float | None:
    """CPU seconds all CPUs of the machine have spent busy since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def percentile(sorted_values: Sequence[float], fraction: float) -> float | None:
    """The value below which ``fraction`` of the values fall (nearest rank); None when empty."""
    if not sorted_values:
        return None
    rank = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[rank]


def process_cpu_seconds(pid: int, children: bool = False) -> float | None:
    """User + system CPU seconds of a running process (all its threads), from /proc; with
    ``children``, also the CPU of its children that it has reaped (cutime, cstime)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    used = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    if children:
        used += int(fields[13]) + int(fields[14])  # cutime, cstime (fields 16 and 17)
    return used / ticks


def process_memory_kib(pid: int) -> dict[str, int]:
    """A running process's resident memory in KiB, from /proc/PID/status: ``VmRSS`` (all of it),
    ``RssAnon`` (heap and other private memory), ``RssFile`` (mapped files: LMDB's map among
    them). Empty when the process is gone."""
    wanted = ("VmRSS", "RssAnon", "RssFile")
    try:
        with open(f"/proc/{pid}/status") as status:
            lines = status.read().splitlines()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in wanted:
            out[key] = int(value.split()[0])  # "12345 kB"
    return out


def writer_figures(
    before: dict[str, float], after: dict[str, float], seconds: float
) -> dict[str, float] | None:
    """What the server's writers did between two reads of their counts (``procs.WRITER_METRICS``):
    commits and their rate, commands per group commit, and the mean time of one commit (its
    fsync included, not the commands applied before it). None without both reads."""
    if not before or not after:
        return None
    delta = {name: after[name] - before[name] for name in after}
    commits = delta["sessionlog_commits_total"]
    groups = delta["sessionlog_commit_group_size_count"]
    timed = delta["sessionlog_commit_duration_seconds_count"]
    return {
        "commits": commits,
        "commits_per_second": commits / seconds if seconds > 0 else 0.0,
        "syncs": delta.get("sessionlog_syncs_total", 0.0),
        "events": delta["sessionlog_appended_events_total"],
        "commands_per_group": delta["sessionlog_commit_group_size_sum"] / groups if groups else 0.0,
        "commit_ms": delta["sessionlog_commit_duration_seconds_sum"] / timed * 1e3
        if timed
        else 0.0,
    }


@dataclass
class Measurement:
    """One measured run: what was done, how long it took, and the CPU each side used."""

    name: str
    events: int
    calls: int
    seconds: float
    """Wall time of the measured window."""
    client_cpu_seconds: float
    """CPU used by the load generator (all of its processes) in the window."""
    server_cpu_seconds: float | None = None
    """CPU used by the server process in the window (None: no server process)."""
    system_cpu_seconds: float | None = None
    """CPU used by the whole machine (every process) in the window."""
    window_seconds: float | None = None
    """The window the server and machine CPU were read over (default: ``seconds``)."""
    client_processes: int = 1
    p50_ms: float | None = None
    p99_ms: float | None = None
    errors: int = 0
    first_error: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    @property
    def client_cores(self) -> float:
        """Average cores the load generator kept busy (its CPU seconds per wall second)."""
        return self.client_cpu_seconds / self.seconds if self.seconds > 0 else 0.0

    @property
    def server_cores(self) -> float | None:
        window = self.window_seconds or self.seconds
        if self.server_cpu_seconds is None or window <= 0:
            return None
        return self.server_cpu_seconds / window

    @property
    def server_us_per_call(self) -> float | None:
        """Microseconds of server CPU (every thread of its process) per call: what a call costs
        the server, whatever else the machine was doing (its rate depends on that)."""
        if self.server_cpu_seconds is None or self.calls <= 0:
            return None
        return self.server_cpu_seconds / self.calls * 1e6

    @property
    def other_cores(self) -> float | None:
        """Cores kept busy by everything else on the machine: other work skews the figures."""
        window = self.window_seconds or self.seconds
        if self.system_cpu_seconds is None or window <= 0:
            return None
        ours = self.client_cpu_seconds + (self.server_cpu_seconds or 0.0)
        return max(0.0, self.system_cpu_seconds - ours) / window

    def set_latencies(self, latencies_ms: list[float]) -> None:
        latencies_ms.sort()
        self.p50_ms = percentile(latencies_ms, 0.50)
        self.p99_ms = percentile(latencies_ms, 0.99)
        if latencies_ms:
            self.details["mean_ms"] = statistics.fmean(latencies_ms)
            self.details["max_ms"] = latencies_ms[-1]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["events_per_second"] = self.events_per_second
        data["client_cores"] = self.client_cores
        data["server_cores"] = self.server_cores
        data["other_cores"] = self.other_cores
        data["server_us_per_call"] = self.server_us_per_call
        return data
