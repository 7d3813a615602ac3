"""The one table (each sessionlog case next to its ceiling) and the same as JSON."""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import frameworks, last
from bench.common import Measurement, Settings
from bench.sessions import SessionsResult

SATURATED = 0.9
"""A share of the CPU this high counts as a limit."""
NOISY = 0.25
"""Cores used by other processes during a measurement above which its row is marked noisy."""


@dataclass
class Row:
    """A sessionlog figure next to one ceiling or peer measured in the same run."""

    case: str
    sessionlog: Measurement
    ceiling: Measurement
    kind: str = "ceiling"
    """What the ceiling column holds: "echo", "handoff" (echo through a worker thread), "lmdb",
    "derived", "redis" or "etcd" (a peer), "unchecked" (the same path without change-record
    checksums) or "sync" (the same load on a server with the default --durability)."""

    @property
    def load_client(self) -> str:
        """What sent the calls: "h2load" (compiled) or "python" (the bench's grpc clients)."""
        return str(self.sessionlog.details.get("load_client", "python"))

    @property
    def ratio(self) -> float | None:
        top = self.ceiling.events_per_second
        return self.sessionlog.events_per_second / top if top else None

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "kind": self.kind,
            "load_client": self.load_client,
            "sessionlog": self.sessionlog.to_json(),
            "ceiling": self.ceiling.to_json(),
            "ratio": self.ratio,
            "limit": limit_note(self),
        }


@dataclass
class WorkersRow:
    """One case at ``--workers 1`` and at ``--workers N``, and the peer beside N (if any)."""

    case: str
    one: Measurement
    many: Measurement
    peer: Measurement | None = None

    @property
    def is_tail(self) -> bool:
        return "followers" in self.many.details

    @property
    def ratio(self) -> float | None:
        """N workers over one, in events per second (None for a tail: its rate is offered)."""
        base = self.one.events_per_second
        return self.many.events_per_second / base if base and not self.is_tail else None

    @property
    def peer_ratio(self) -> float | None:
        """N workers over the peer, in events per second."""
        if self.peer is None or not self.peer.events_per_second:
            return None
        return self.many.events_per_second / self.peer.events_per_second

    def measurements(self) -> list[Measurement]:
        return [self.one, self.many, *([self.peer] if self.peer else [])]

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "workers_1": self.one.to_json(),
            "workers_n": self.many.to_json(),
            "peer": self.peer.to_json() if self.peer else None,
            "ratio": self.ratio,
            "peer_ratio": self.peer_ratio,
        }


@dataclass
class StreamRow:
    """Case 13: one appendload case at ``--workers 1`` and at 2, and the etcd row beside it."""

    case: str
    one: Measurement
    many: Measurement
    peer: Measurement | None = None
    pipelined_peer: Measurement | None = None
    """etcd's Put with as many calls in flight per client as each stream keeps (shown, not a
    target)."""

    @property
    def ratio(self) -> float | None:
        """Two workers over one, in events per second."""
        base = self.one.events_per_second
        return self.many.events_per_second / base if base else None

    def peer_ratio(self, measurement: Measurement) -> float | None:
        """``measurement`` (one of this row's) over etcd, in events per second."""
        if self.peer is None or not self.peer.events_per_second:
            return None
        return measurement.events_per_second / self.peer.events_per_second

    def measurements(self) -> list[Measurement]:
        peers = [m for m in (self.peer, self.pipelined_peer) if m is not None]
        return [self.one, self.many, *peers]

    def to_json(self) -> dict[str, Any]:
        pipelined = self.pipelined_peer
        rate = pipelined.events_per_second if pipelined else 0.0
        return {
            "case": self.case,
            "workers_1": self.one.to_json(),
            "workers_2": self.many.to_json(),
            "peer": self.peer.to_json() if self.peer else None,
            "pipelined_peer": pipelined.to_json() if pipelined else None,
            "pipelined_peer_ratios": [m.events_per_second / rate for m in (self.one, self.many)]
            if rate
            else None,
            "workers_ratio": self.ratio,
            "peer_ratio_workers_1": self.peer_ratio(self.one),
            "peer_ratio_workers_2": self.peer_ratio(self.many),
        }


@dataclass
class Results:
    """Everything one run measured."""

    rows: list[Row]
    tails: list[Measurement]
    derives: list[Measurement]
    notes: list[str]
    sessions: SessionsResult | None = None
    etcd: list[Row] = field(default_factory=list)
    """sessionlog beside etcd, both driven by h2load (kind "etcd"), in a table of their own."""
    workers: list[WorkersRow] = field(default_factory=list)
    """Each write and tail case at ``--workers 1`` and ``--workers N``, etcd beside N."""
    last: list[Measurement] = field(default_factory=list)
    """Case 11: reads from the end beside the same reads from the start (``bench.last``)."""
    shards: list[Row] = field(default_factory=list)
    """Case 10: through HAProxy beside direct (kind "direct"), two groups beside one (kind
    "haproxy 1 group"), in a table of their own."""
    frameworks: list[frameworks.CallRow] = field(default_factory=list)
    """Case 12: the framework backends' calls beside SQLite, Redis and Postgres."""
    streams: list[StreamRow] = field(default_factory=list)
    """Case 13: AppendStream and unary Append through appendload, at 1 and 2 workers, etcd
    beside."""

    def measurements(self) -> list[Measurement]:
        """Every measurement of the run (a sessionlog figure appears once per row it is in)."""
        return [
            *(
                m
                for row in (*self.rows, *self.etcd, *self.shards)
                for m in (row.sessionlog, row.ceiling)
            ),
            *(m for row in self.workers for m in row.measurements()),
            *(m for row in self.streams for m in row.measurements()),
            *self.tails,
            *self.derives,
            *self.last,
            *(self.sessions.measurements() if self.sessions else []),
        ]


def machine() -> dict[str, Any]:
    """What the figures depend on, including how busy the machine was when the run started."""
    import grpc
    import lmdb

    try:
        load = [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        load = []
    return {
        "cpus": os.cpu_count(),
        "load_average_at_start": load,
        "python": platform.python_version(),
        "grpc": grpc.__version__,
        "lmdb": lmdb.__version__,
        "platform": platform.platform(),
    }


def limit_note(row: Row) -> str:
    """Why a row's figures may show a client or machine limit rather than the server's own."""
    cpus = os.cpu_count() or 1
    sessionlog = row.sessionlog
    notes = []
    if sessionlog.client_cores >= SATURATED * sessionlog.client_processes:
        notes.append("client-bound")
    total = sessionlog.client_cores + (sessionlog.server_cores or 0.0)
    if total + (sessionlog.other_cores or 0.0) >= SATURATED * cpus:
        notes.append("cpu-bound")
    others = max(m.other_cores or 0.0 for m in (row.sessionlog, row.ceiling))
    if others >= NOISY:
        notes.append("noisy")
    return ",".join(notes)


def _rate(measurement: Measurement) -> str:
    rate = measurement.events_per_second
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:,.1f}"


def _latency(measurement: Measurement) -> str:
    if measurement.p50_ms is None:
        seconds = measurement.details.get("median_run_seconds")
        return f"run {seconds * 1000:.0f}" if seconds is not None else "-"
    p99 = "-" if measurement.p99_ms is None else f"{measurement.p99_ms:.2f}"
    return f"{measurement.p50_ms:.2f}/{p99}"


def _cores(measurement: Measurement) -> str:
    cells = [measurement.client_cores, measurement.server_cores, measurement.other_cores]
    return "/".join("-" if value is None else f"{value:.2f}" for value in cells)


def _per_call(measurement: Measurement) -> str:
    value = measurement.server_us_per_call
    return "-" if value is None else f"{value:,.0f}"


COLUMNS = (
    ("case", 39, "<"),
    ("sessionlog ev/s", 15, ">"),
    ("p50/p99 ms", 12, ">"),
    ("cpu cli/srv/oth", 15, ">"),
    ("srv us/call", 11, ">"),
    ("ceiling", 46, "<"),
    ("ceiling ev/s", 13, ">"),
    ("p50/p99 ms", 12, ">"),
    ("cpu cli/srv/oth", 15, ">"),
    ("srv us/call", 11, ">"),
    ("ratio", 6, ">"),
    ("limit", 12, "<"),
)


def _line(cells: list[str]) -> str:
    return "  ".join(
        f"{cell:{align}{width}}" for cell, (_, width, align) in zip(cells, COLUMNS, strict=True)
    ).rstrip()


def table(rows: list[Row]) -> str:
    lines = [_line([name for name, _, _ in COLUMNS])]
    lines.append("-" * len(lines[0]))
    for row in rows:
        ratio = row.ratio
        flag = " !" if row.sessionlog.errors or row.ceiling.errors else ""
        lines.append(
            _line(
                [
                    row.case + flag,
                    _rate(row.sessionlog),
                    _latency(row.sessionlog),
                    _cores(row.sessionlog),
                    _per_call(row.sessionlog),
                    row.ceiling.name,
                    _rate(row.ceiling),
                    _latency(row.ceiling),
                    _cores(row.ceiling),
                    _per_call(row.ceiling),
                    "-" if ratio is None else f"{ratio:.2f}",
                    limit_note(row),
                ]
            )
        )
    return "\n".join(lines)


def cpu_per_call_us(measurement: Measurement) -> float | None:
    """The server's CPU per call counted, in µs (None: no server CPU or no call)."""
    if measurement.server_cpu_seconds is None or not measurement.calls:
        return None
    return measurement.server_cpu_seconds / measurement.calls * 1e6


def etcd_table(rows: list[Row]) -> str:
    """Each sessionlog row, and under it the etcd row it stands beside, with the ratio."""
    header = (
        f"{'case (both h2load)':<52}  {'ev/s':>10}  {'calls/s':>8}  {'p50/p99 ms':>14}  "
        f"{'cpu cli/srv/oth':>15}  {'srv us/call':>11}  {'ratio':>5}  limit"
    )
    lines = [header, "-" * len(header)]

    def line(measurement: Measurement, name: str, ratio: str, limit: str) -> str:
        calls = measurement.calls / measurement.seconds if measurement.seconds > 0 else 0.0
        flag = " !" if measurement.errors else ""
        return (
            f"{name + flag:<52}  {_rate(measurement):>10}  {calls:>8,.0f}  "
            f"{_latency(measurement):>14}  {_cores(measurement):>15}  "
            f"{_ms(cpu_per_call_us(measurement)):>11}  {ratio:>5}  {limit}"
        ).rstrip()

    for row in rows:
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}"
        lines.append(line(row.sessionlog, row.sessionlog.name, "", ""))
        lines.append(line(row.ceiling, "  " + row.ceiling.name, ratio, limit_note(row)))
    return "\n".join(lines)


def _shard_runs(rows: list[Row]) -> list[tuple[Measurement, str]]:
    """Case 10's runs in order (direct, 1 group via HAProxy, 2 groups via HAProxy), each with
    its ratio to the run before it ("" for the first)."""
    runs: list[tuple[Measurement, str]] = []
    for row in rows:
        if not runs:
            runs.append((row.ceiling, ""))
        runs.append((row.sessionlog, "-" if row.ratio is None else f"{row.ratio:.2f}"))
    return runs


def shards_table(rows: list[Row]) -> str:
    """Case 10: direct, via HAProxy to one group (ratio to direct), to two (ratio to one)."""
    header = (
        f"{'case 10 (h2load, 16 clients, 1 ev/call)':<44}  {'ev/s':>8}  {'p50/p99 ms':>11}  "
        f"{'cpu cli/srv/oth':>15}  {'srv us/call':>11}  {'haproxy cores':>13}  "
        f"{'haproxy ms/1k':>13}  {'ratio':>5}  limit"
    )
    lines = [header, "-" * len(header)]
    for measurement, ratio in _shard_runs(rows):
        details = measurement.details
        via = "direct to the primary" if details.get("via") == "direct" else "via haproxy"
        groups = details.get("groups", 1)
        name = f"{via}, {groups} group{'s' if groups != 1 else ''}"
        flag = " !" if measurement.errors else ""
        cores = details.get("haproxy_cores")
        per_call = details.get("haproxy_us_per_call")
        lines.append(
            (
                f"{name + flag:<44}  {_rate(measurement):>8}  {_latency(measurement):>11}  "
                f"{_cores(measurement):>15}  {_ms(cpu_per_call_us(measurement)):>11}  "
                f"{'-' if cores is None else f'{cores:.2f}':>13}  "
                f"{'-' if per_call is None else f'{per_call:.0f}':>13}  {ratio:>5}  "
                f"{limit_note(Row('', measurement, measurement))}"
            ).rstrip()
        )
    return "\n".join(lines)


def shards_paper(rows: list[Row]) -> list[str]:
    """Case 10 on paper: how far N groups on N machines scale before HAProxy is the limit,
    from the figures this run measured."""
    runs = [measurement for measurement, _ in _shard_runs(rows)]
    proxied = [m for m in runs if m.details.get("haproxy_us_per_call")]
    if not runs or not proxied:
        return []
    direct = runs[0]
    proxy_us = proxied[-1].details["haproxy_us_per_call"]
    per_core = 1e6 / proxy_us
    rate = direct.calls / direct.seconds if direct.seconds > 0 else 0.0
    server_us = cpu_per_call_us(direct)
    lines = [
        "On this machine the groups share its CPUs: the 2-group row measures what routing "
        "through HAProxy to two groups costs, not scaling (ratio: to the row above).",
        f"On paper, one group per machine: HAProxy spent {proxy_us:.0f} ms of CPU per 1,000 "
        f"appends (the {proxied[-1].details.get('groups')}-group row), so one HAProxy core "
        f"forwards at most {per_core:,.0f} appends/s.",
    ]
    if rate > 0:
        lines.append(
            f"A group alone did {rate:,.0f} appends/s here (direct; a lower bound: it shared "
            f"the CPUs with h2load) at {_ms(server_us)} us of server CPU per append; N groups "
            f"on N machines give about N x {rate:,.0f} appends/s until that reaches k x "
            f"{per_core:,.0f} for k HAProxy cores: about {per_core / rate:.0f} groups per "
            "HAProxy core."
        )
    if server_us:
        lines.append(
            f"Per append a group's server spent {server_us / proxy_us:.1f}x HAProxy's CPU "
            f"({_ms(server_us)} us / {proxy_us:.0f} us): were the groups CPU-bound, one HAProxy "
            f"core would keep up with about {server_us / proxy_us:.1f} server cores."
        )
    return lines


def workers_table(rows: list[WorkersRow]) -> str:
    """Each write case at one worker, then at N with the ratio N/1, then etcd with N/etcd."""
    header = (
        f"{'case (all h2load)':<42}  {'workers':>7}  {'ev/s':>8}  {'p50/p99 ms':>11}  "
        f"{'cpu cli/srv/oth':>15}  {'srv us/call':>11}  {'conns':>6}  {'commits/s':>9}  "
        f"{'cmds/commit':>11}  {'commit ms':>9}  {'ratio':>5}  limit"
    )
    lines = [header, "-" * len(header)]

    def line(m: Measurement, name: str, workers: str, ratio: float | None, limit: str) -> str:
        writer = m.details.get("writer") or {}
        spread = m.details.get("connections_per_worker") or []
        flag = " !" if m.errors else ""
        return (
            f"{name + flag:<42}  {workers:>7}  {_rate(m):>8}  {_latency(m):>11}  "
            f"{_cores(m):>15}  {_ms(cpu_per_call_us(m)):>11}  "
            f"{'/'.join(map(str, spread)) or '-':>6}  "
            f"{_count(writer.get('commits_per_second')):>9}  "
            f"{_ms(writer.get('commands_per_group')):>11}  {_ms(writer.get('commit_ms')):>9}  "
            f"{'-' if ratio is None else f'{ratio:.2f}':>5}  {limit}"
        ).rstrip()

    for row in rows:
        if row.is_tail:
            continue
        count = str(row.many.details.get("workers", "N"))
        lines.append(
            line(row.one, row.case, "1", None, limit_note(Row(row.case, row.one, row.one)))
        )
        lines.append(
            line(row.many, "", count, row.ratio, limit_note(Row(row.case, row.many, row.one)))
        )
        if row.peer is not None:
            limit = limit_note(Row(row.case, row.many, row.peer))
            lines.append(line(row.peer, "  " + row.peer.name, "-", row.peer_ratio, limit))
    return "\n".join(lines)


def stream_table(rows: list[StreamRow]) -> str:
    """Case 13: each appendload case at one worker and at two (ratio to etcd, and 2/1), then the
    etcd row it stands beside."""
    header = (
        f"{'case 13 (appendload; etcd: h2load)':<54}  {'workers':>7}  {'ev/s':>8}  "
        f"{'appends/s':>9}  {'p50/p99 ms':>11}  {'cpu cli/srv/oth':>15}  {'srv us/call':>11}  "
        f"{'conns':>6}  {'cmds/commit':>11}  {'vs etcd':>9}  {'vs 1':>5}  limit"
    )
    lines = [header, "-" * len(header)]

    def line(m: Measurement, name: str, workers: str, peer: str, one: float | None) -> str:
        writer = m.details.get("writer") or {}
        spread = m.details.get("connections_per_worker") or []
        calls = m.calls / m.seconds if m.seconds > 0 else 0.0
        flag = " !" if m.errors else ""
        return (
            f"{name + flag:<54}  {workers:>7}  {_rate(m):>8}  {calls:>9,.0f}  {_latency(m):>11}  "
            f"{_cores(m):>15}  {_ms(cpu_per_call_us(m)):>11}  "
            f"{'/'.join(map(str, spread)) or '-':>6}  "
            f"{_ms(writer.get('commands_per_group')):>11}  "
            f"{peer:>9}  "
            f"{'-' if one is None else f'{one:.2f}':>5}  "
            f"{limit_note(Row(name, m, m))}"
        ).rstrip()

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    shown: set[int] = set()
    for row in rows:
        lines.append(line(row.one, row.case, "1", ratio(row.peer_ratio(row.one)), None))
        lines.append(line(row.many, "", "2", ratio(row.peer_ratio(row.many)), row.ratio))
        if row.peer is not None and id(row.peer) not in shown:
            shown.add(id(row.peer))
            lines.append(line(row.peer, "  " + row.peer.name, "-", "-", None))
        pipelined = row.pipelined_peer
        if pipelined is not None and pipelined.events_per_second:
            one, two = (
                m.events_per_second / pipelined.events_per_second for m in (row.one, row.many)
            )
            lines.append(line(pipelined, "  " + pipelined.name, "-", f"{one:.2f}/{two:.2f}", None))
    return "\n".join(lines)


def stream_targets(rows: list[StreamRow]) -> list[Target]:
    """Issue 33's targets for the AppendStream rows: at least etcd's rate beside them, at one
    worker and at two, and two workers never slower than one on any row."""
    out: list[Target] = []

    def at_least(what: str, value: float | None) -> Target:
        return Target(
            what,
            ">= 1x",
            "-" if value is None else f"{value:.2f}x",
            None if value is None else value >= 1.0,
        )

    for row in rows:
        if row.one.details.get("mode") == "stream" and row.peer is not None:
            peer = row.peer.name.removesuffix(" (h2load)")
            for workers, measurement in ((1, row.one), (2, row.many)):
                out.append(
                    at_least(
                        f"{row.case}, --workers {workers} vs {peer}",
                        row.peer_ratio(measurement),
                    )
                )
    for row in rows:
        out.append(at_least(f"{row.case}: --workers 2 vs 1", row.ratio))
    return out


def workers_tail_table(rows: list[WorkersRow]) -> str:
    """The live tail at one worker and at N: ack->arrival above all, and where each landed."""
    header = (
        f"{'case':<36}  {'workers':>7}  {'appends/s':>9}  {'ack->arrival p50/p99':>20}  "
        f"{'send->arrival p50/p99':>21}  {'append p50/p99':>14}  {'cpu cli/srv/oth':>15}  "
        f"{'srv us/append':>13}  writer / followers on"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        if not row.is_tail:
            continue
        for m, name in ((row.one, row.case), (row.many, "")):
            d = m.details
            ack = f"{_ms(d.get('ack_to_arrival_p50_ms'))}/{_ms(d.get('ack_to_arrival_p99_ms'))}"
            send = f"{_ms(m.p50_ms)}/{_ms(m.p99_ms)}"
            append = f"{_ms(d.get('append_p50_ms'))}/{_ms(d.get('append_p99_ms'))}"
            placed = "-"
            if d.get("workers", 1) > 1:
                writer = ",".join(f"w{w}" for w in d.get("writer_workers", [])) or "?"
                followers = ",".join(f"w{w}" for w in d.get("follower_workers", [])) or "?"
                placed = f"{writer} / {followers}"
            flag = " !" if m.errors else ""
            lines.append(
                f"{name + flag:<36}  {d.get('workers', 1):>7}  {m.events_per_second:>9,.0f}  "
                f"{ack:>20}  {send:>21}  {append:>14}  {_cores(m):>15}  "
                f"{_ms(cpu_per_call_us(m)):>13}  {placed}"
            )
    return "\n".join(lines)


def tail_table(tails: list[Measurement]) -> str:
    header = (
        f"{'case':<36}  {'appends/s':>9}  {'send->arrival p50/p99/max ms':>28}  "
        f"{'ack->arrival p50/p99':>20}  {'append p50/p99':>14}  {'cpu cli/srv/oth':>15}"
    )
    lines = [header, "-" * len(header)]
    for m in tails:
        d = m.details
        arrival = f"{_ms(m.p50_ms)}/{_ms(m.p99_ms)}/{_ms(d.get('max_ms'))}"
        ack = f"{_ms(d.get('ack_to_arrival_p50_ms'))}/{_ms(d.get('ack_to_arrival_p99_ms'))}"
        append = f"{_ms(d.get('append_p50_ms'))}/{_ms(d.get('append_p99_ms'))}"
        flag = " !" if m.errors else ""
        lines.append(
            f"{m.name + flag:<36}  {m.events_per_second:>9,.0f}  {arrival:>28}  {ack:>20}  "
            f"{append:>14}  {_cores(m):>15}"
        )
    return "\n".join(lines)


def derive_table(derives: list[Measurement]) -> str:
    header = (
        f"{'case':<32}  {'messages':>8}  {'cold ms':>8}  {'memoized p50/p99 ms':>19}  "
        f"{'after 1 append ms':>17}  {'memoized us/msg':>15}"
    )
    lines = [header, "-" * len(header)]
    for m in derives:
        d = m.details
        memoized = f"{_ms(m.p50_ms)}/{_ms(m.p99_ms)}"
        flag = " !" if m.errors else ""
        lines.append(
            f"{m.name + flag:<32}  {d['messages']:>8,}  {_ms(d['cold_median_ms']):>8}  "
            f"{memoized:>19}  {_ms(d.get('after_append_p50_ms')):>17}  "
            f"{_ms(d.get('memoized_us_per_message')):>15}"
        )
    return "\n".join(lines)


def sessions_table(result: SessionsResult) -> str:
    header = (
        f"{'case':<44}  {'sessions/s':>10}  {'page p50/p99 ms':>15}  {'pages':>6}  "
        f"{'cpu cli/srv/oth':>15}"
    )
    lines = [header, "-" * len(header)]
    for m in result.listings:
        flag = " !" if m.errors else ""
        lines.append(
            f"{m.name + flag:<44}  {_rate(m):>10}  {_ms(m.p50_ms) + '/' + _ms(m.p99_ms):>15}  "
            f"{m.calls:>6,}  {_cores(m):>15}"
        )
    return "\n".join(lines)


def memory_table(result: SessionsResult) -> str:
    kinds = ("VmRSS", "RssAnon", "RssFile")
    header = f"{'server memory (MiB)':<44}  " + "  ".join(f"{k:>8}" for k in kinds)
    lines = [header, "-" * len(header)]

    def mib(kib: int | None) -> str:
        return "-" if kib is None else f"{kib / 1024:,.1f}"

    for sample in result.memory:
        cells = "  ".join(f"{mib(sample.kib.get(k)):>8}" for k in kinds)
        lines.append(f"{sample.when:<44}  {cells}")
    before, filled = result.memory[0].kib, result.memory[1].kib
    if before and filled:
        cells = "  ".join(f"{'+' + mib(filled[k] - before[k]):>8}" for k in kinds)
        lines.append(f"{'growth while filling':<44}  {cells}")
    return "\n".join(lines)


def _fill_note(result: SessionsResult) -> str:
    fill = result.fill
    return (
        f"7 fill (untimed setup): {fill.calls:,} Appends of {result.events_per_session} events, "
        f"{fill.details.get('in_flight')} in flight, in {fill.seconds:.1f} s ({_rate(fill)} ev/s, "
        f"p50/p99 {_latency(fill)} ms, cpu cli/srv/oth {_cores(fill)}). The list rows page "
        "through every session of the case (prefix c7-), one call at a time, "
        f"{result.listings[0].details['passes'] if result.listings else 0} timed pass(es) per "
        "page size; sessions/s includes the client decoding each reply. Server memory is "
        "/proc/PID/status; 'before filling' is after the cases that ran before it in this run."
    )


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


@dataclass
class Target:
    what: str
    goal: str
    measured: str
    met: bool | None
    """None: not measured in this run."""


def targets(results: Results) -> list[Target]:
    """Issue 7's targets and issue 14's (against etcd, CPU per call), each with what this run
    measured."""

    def row(number: str, kind: str, client: str = "python") -> Row | None:
        return next(
            (
                r
                for r in results.rows
                if r.case.startswith(number) and r.kind == kind and r.load_client == client
            ),
            None,
        )

    out: list[Target] = []

    def ratio_target(what: str, found: Row | None, goal: float) -> None:
        ratio = None if found is None else found.ratio
        out.append(
            Target(
                what,
                f">= {goal:g}x",
                "-" if ratio is None else f"{ratio:.2f}x",
                None if ratio is None else ratio >= goal,
            )
        )

    # h2load's row is the fairer measure: 16 Python clients saturate before the server does.
    concurrent, client = row("2 ", "echo", "h2load"), " (h2load)"
    if concurrent is None:
        concurrent = row("2 ", "echo")
        client = "" if concurrent is None else " (Python client)"
    ratio_target(f"append 1 ev/call, 16 clients vs echo unary{client}", concurrent, 0.8)
    cost = None
    if concurrent is not None:
        ours, echo = concurrent.sessionlog.server_us_per_call, concurrent.ceiling.server_us_per_call
        cost = None if ours is None or not echo else ours / echo
    out.append(
        Target(
            f"append 1 ev/call, 16 clients: server CPU per call vs echo's{client}",
            "<= 1.5x",
            "-" if cost is None else f"{cost:.2f}x",
            None if cost is None else cost <= 1.5,
        )
    )
    batched = row("3 ", "echo") or row("3 ", "lmdb")
    rate = None if batched is None else batched.sessionlog.events_per_second
    out.append(
        Target(
            "append 100 ev/call, 4 clients, durable",
            ">= 150,000 ev/s",
            "-" if rate is None else f"{rate:,.0f} ev/s",
            None if rate is None else rate >= 150_000,
        )
    )
    ratio_target("append 100 ev/call vs Redis XADD pipelined by 100", row("3 ", "redis"), 3.0)

    # Issue 14's: unary Append at least half of etcd's Put, a batched Append ahead of its Txn.
    def etcd_row(puts_per_call: int) -> Row | None:
        return next(
            (r for r in results.etcd if r.ceiling.details.get("puts_per_call") == puts_per_call),
            None,
        )

    ratio_target("append 1 ev/call, 16 clients vs etcd Put (h2load)", etcd_row(1), 0.5)
    txn = etcd_row(100)
    ratio = None if txn is None else txn.ratio
    out.append(
        Target(
            "append 100 ev/call, 4 clients vs etcd Txn of 100 Puts (h2load)",
            "> 1x (ahead)",
            "-" if ratio is None else f"{ratio:.2f}x",
            None if ratio is None else ratio > 1.0,
        )
    )
    out.extend(workers_targets(results.workers))
    out.extend(stream_targets(results.streams))
    ratio_target("since catch-up vs echo stream", row("4 ", "echo"), 0.7)
    ratio_target("since catch-up vs Redis XRANGE", row("4 ", "redis"), 2.5)
    for m in results.tails:
        # From the acknowledged append to the follower's receipt; issue 33's goals: 5 ms with
        # one follower, 20 ms with 100 (as the --workers N rows).
        p99 = m.details.get("ack_to_arrival_p99_ms")
        goal = 5.0 if m.details["followers"] == 1 else 20.0
        out.append(
            Target(
                f"live tail p99 ack->arrival, {m.details['followers']} follower(s)",
                f"<= {goal:.0f} ms",
                "-" if p99 is None else f"{p99:.2f} ms",
                None if p99 is None or m.errors else p99 <= goal,
            )
        )
    by_name = {m.name: m for m in results.derives}
    for shape in ("no replaces", "with replaces"):
        small = by_name.get(f"6 derive 10k ev, {shape}")
        large = by_name.get(f"6 derive 100k ev, {shape}")
        if small is None or large is None:
            continue
        a = small.details.get("memoized_us_per_message")
        b = large.details.get("memoized_us_per_message")
        growth = None if not a or b is None else b / a
        out.append(
            Target(
                f"derive memoized, {shape}: cost per message 100k vs 10k",
                "<= 1.5x (linear)",
                "-" if growth is None else f"{growth:.2f}x",
                None if growth is None else growth <= 1.5,
            )
        )
    out.extend(
        Target(g.what, g.goal, g.measured, g.met) for g in frameworks.goals(results.frameworks)
    )
    return out


def workers_targets(rows: list[WorkersRow]) -> list[Target]:
    """Issue 14's targets for ``--workers N``: against one worker, against etcd, and the tail."""

    def find(prefix: str) -> WorkersRow | None:
        return next((r for r in rows if r.case.startswith(prefix)), None)

    def ratio(what: str, value: float | None, goal: float, strict: bool = False) -> Target:
        return Target(
            what,
            f"> {goal:g}x (ahead)" if strict else f">= {goal:g}x",
            "-" if value is None else f"{value:.2f}x",
            None if value is None else (value > goal if strict else value >= goal),
        )

    out: list[Target] = []
    concurrent, batched = find("2 "), find("3 ")
    many = next((r.many.details.get("workers") for r in rows), None) or "N"
    label = f"--workers {many}"
    out.append(
        ratio(
            f"append 1 ev/call, 16 clients, {label} vs --workers 1 (h2load)",
            None if concurrent is None else concurrent.ratio,
            1.25,
        )
    )
    out.append(
        ratio(
            f"append 100 ev/call, 4 clients, {label} vs --workers 1 (h2load)",
            None if batched is None else batched.ratio,
            1.5,
        )
    )
    out.append(
        ratio(
            f"append 100 ev/call, 4 clients, {label} vs etcd Txn of 100 Puts",
            None if batched is None else batched.peer_ratio,
            1.0,
            strict=True,
        )
    )
    out.append(
        ratio(
            f"append 1 ev/call, 16 clients, {label} vs etcd Put (h2load)",
            None if concurrent is None else concurrent.peer_ratio,
            0.5,
        )
    )
    for followers, goal in ((100, 20.0), (1, 5.0)):
        found = next(
            (r for r in rows if r.is_tail and r.many.details["followers"] == followers), None
        )
        p99 = None if found is None else found.many.details.get("ack_to_arrival_p99_ms")
        plural = "s" if followers > 1 else ""
        out.append(
            Target(
                f"live tail p99 ack->arrival, {followers} follower{plural}, {label}",
                f"<= {goal:g} ms",
                "-" if p99 is None else f"{p99:.2f} ms",
                None if p99 is None or (found and found.many.errors) else p99 <= goal,
            )
        )
    return out


def targets_table(found: list[Target]) -> str:
    width = max((len(t.what) for t in found), default=10)
    lines = [f"{'target':<{width}}  {'goal':>17}  {'measured':>14}  met", "-" * (width + 42)]
    for t in found:
        met = "n/a" if t.met is None else ("yes" if t.met else "NO")
        lines.append(f"{t.what:<{width}}  {t.goal:>17}  {t.measured:>14}  {met}")
    return "\n".join(lines)


STREAM_NOTE = (
    "Case 13: bench/go/appendload, compiled, one connection per stream or caller, each to its "
    "own session; AppendStream rows keep the window of appends in flight per stream, unary rows "
    "one call per caller; p50/p99: from sending an append to its answer. The --workers 2 rows "
    "run on a second server of two workers. vs etcd: the row over etcd's row under it (Put: one "
    "call in flight per h2load client), in events per second; on the line of etcd's Put with "
    "calls in flight (h2load -m, as many as a stream keeps; not a target), the AppendStream "
    "row at 1/2 workers over it; vs 1: two workers over one. "
    "Checked: no error reported, and every session grew by exactly the events acknowledged."
)


def render(results: Results, settings: Settings, mode: str, info: dict[str, Any]) -> str:
    load = "/".join(f"{x:.2f}" for x in info["load_average_at_start"]) or "?"
    header = (
        f"sessionlog bench ({mode}: {settings.duration:g} s per timed case) on "
        f"{info['cpus']} CPUs, Python {info['python']}, grpc {info['grpc']}, "
        f"lmdb {info['lmdb']}; all on 127.0.0.1; load average at start {load}"
    )
    notes = [
        "ev/s: events per second. ratio: sessionlog / ceiling (or / peer). p50/p99: per call "
        "(streams: median time of a whole read).",
        "cpu cli/srv/oth: cores kept busy (CPU seconds per wall second) by the load generator "
        "(all its processes), the server process, and every other process on the machine. "
        "srv us/call: the server process's CPU per call (all its threads), in microseconds.",
        f"limit: client-bound = the client processes used >= {SATURATED:.0%} of a core each; "
        f"cpu-bound = all processes used >= {SATURATED:.0%} of the {info['cpus']} CPUs, so the "
        "figure is a lower bound of what the server alone could do; noisy = other processes "
        f"used >= {NOISY} cores during the case or its ceiling.",
        "The server, the load generator and the LMDB ceiling share this machine's CPUs and disk.",
    ]
    problems = [
        f"! {m.name}: {m.errors} errors, first: {m.first_error}"
        for m in results.measurements()
        if m.errors
    ]
    parts = [header, "", *([table(results.rows), ""] if results.rows else []), *notes]
    if results.tails:
        parts += [
            "",
            tail_table(results.tails),
            "",
            "send->arrival: from sending an append to the event's arrival at a follower (all "
            "followers' samples); ack->arrival: from the writer's acknowledgment (negative: the "
            "follower had it first).",
        ]
    if results.derives:
        parts += [
            "",
            derive_table(results.derives),
            "",
            "cold: first call after a server start (fold built from LMDB); memoized: nothing "
            "appended since the last call; after 1 append: the memo extended by one event.",
        ]
    if results.last:
        parts += ["", last.table(results.last), "", last.note(results.last)]
    if results.etcd:
        parts += [
            "",
            etcd_table(results.etcd),
            "",
            "The peer: etcd, one member with its default durability (WAL fsynced before the "
            "reply), both servers driven by the same h2load clients; ratio: sessionlog / etcd in "
            "events per second; srv us/call: the server's CPU per call. Put: each client puts to "
            "its own key (every Put a new revision); Txn: 100 Puts to a client's own 100 keys; "
            "Range: the last page of a log of keys, beside Since from the same page of a "
            "session as long. Checked: etcd's revision grew by exactly the "
            "calls applied, every key by h2load's count (or one more, in flight at the stop); "
            "every read reply complete.",
        ]
    if results.workers:
        parts += [
            "",
            workers_table(results.workers),
            "",
            workers_tail_table(results.workers),
            "",
            "--workers: the bench's main server runs one worker; the N-worker rows come from a "
            "second server of N worker processes (one per usable CPU, the server's default) on a "
            "folder of its own, driven the same way. srv: the whole server (the supervisor and "
            "every worker); conns: the connections each worker held midway (the kernel spreads "
            "them, one per h2load client); commits/s, cmds/commit (commands per group commit) "
            "and commit ms (one commit, its fsync included) come from the server's /metrics, "
            "summed over the workers; ratio: N workers / 1 on the N line, N workers / etcd on "
            "etcd's. writer / followers on: the workers that served the tail's writer and its "
            "followers' connections (another worker's followers are woken by the doorbells).",
        ]
    if results.streams:
        parts += ["", stream_table(results.streams), "", STREAM_NOTE]
    if results.shards:
        parts += [
            "",
            shards_table(results.shards),
            "",
            "Case 10: static groups (--shard-map FILE) of one primary each, HAProxy on the "
            "files `sessionlog cluster haproxy` writes; each h2load client sends its session's "
            "x-session-id. srv: the groups' servers together; oth includes HAProxy; haproxy "
            "cores and ms/1k: its CPU (/proc utime+stime, all threads) over the run, per "
            "wall second and per 1,000 appends. Checked: every session grew in its own group "
            "by the calls h2load counted.",
            *shards_paper(results.shards),
        ]
    if results.frameworks:
        parts += ["", frameworks.table(results.frameworks), "", frameworks.note(settings)]
    if results.sessions:
        parts += [
            "",
            sessions_table(results.sessions),
            "",
            memory_table(results.sessions),
            "",
            _fill_note(results.sessions),
        ]
    parts += ["", targets_table(targets(results)), *results.notes, *dict.fromkeys(problems)]
    return "\n".join(parts)


def write_json(
    path: Path, results: Results, settings: Settings, mode: str, info: dict[str, Any]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "mode": mode,
        "argv": sys.argv,
        "machine": info,
        "settings": asdict(settings),
        "rows": [row.to_json() for row in results.rows],
        "live_tail": [m.to_json() for m in results.tails],
        "derive": [m.to_json() for m in results.derives],
        "last": [m.to_json() for m in results.last],
        "sessions": results.sessions.to_json() if results.sessions else None,
        "etcd": [row.to_json() for row in results.etcd],
        "workers": [row.to_json() for row in results.workers],
        "shards": [row.to_json() for row in results.shards],
        "frameworks": [row.to_json() for row in results.frameworks],
        "streams": [row.to_json() for row in results.streams],
        "targets": [asdict(t) for t in targets(results)],
        "notes": results.notes,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
