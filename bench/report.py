"""The one table (each sessionlog case next to its ceiling) and the same as JSON."""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import Measurement, Settings

SATURATED = 0.9
"""A share of the CPU this high counts as a limit."""
NOISY = 0.25
"""Cores used by other processes during a measurement above which its row is marked noisy."""


@dataclass
class Row:
    case: str
    sessionlog: Measurement
    ceiling: Measurement

    @property
    def ratio(self) -> float | None:
        top = self.ceiling.events_per_second
        return self.sessionlog.events_per_second / top if top else None

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "sessionlog": self.sessionlog.to_json(),
            "ceiling": self.ceiling.to_json(),
            "ratio": self.ratio,
            "limit": limit_note(self),
        }


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


COLUMNS = (
    ("case", 30, "<"),
    ("sessionlog ev/s", 15, ">"),
    ("p50/p99 ms", 12, ">"),
    ("cpu cli/srv/oth", 15, ">"),
    ("ceiling", 30, "<"),
    ("ceiling ev/s", 13, ">"),
    ("p50/p99 ms", 12, ">"),
    ("cpu cli/srv/oth", 15, ">"),
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
                    row.ceiling.name,
                    _rate(row.ceiling),
                    _latency(row.ceiling),
                    _cores(row.ceiling),
                    "-" if ratio is None else f"{ratio:.2f}",
                    limit_note(row),
                ]
            )
        )
    return "\n".join(lines)


def render(rows: list[Row], settings: Settings, mode: str, info: dict[str, Any]) -> str:
    load = "/".join(f"{x:.2f}" for x in info["load_average_at_start"]) or "?"
    header = (
        f"sessionlog bench ({mode}: {settings.duration:g} s per timed case) on "
        f"{info['cpus']} CPUs, Python {info['python']}, grpc {info['grpc']}, "
        f"lmdb {info['lmdb']}; all on 127.0.0.1; load average at start {load}"
    )
    notes = [
        "ev/s: events per second. ratio: sessionlog / ceiling. p50/p99: per call (streams: "
        "median time of a whole read).",
        "cpu cli/srv/oth: cores kept busy (CPU seconds per wall second) by the load generator "
        "(all its processes), the server process, and every other process on the machine.",
        f"limit: client-bound = the client processes used >= {SATURATED:.0%} of a core each; "
        f"cpu-bound = all processes used >= {SATURATED:.0%} of the {info['cpus']} CPUs, so the "
        "figure is a lower bound of what the server alone could do; noisy = other processes "
        f"used >= {NOISY} cores during the case or its ceiling.",
        "The server, the load generator and the LMDB ceiling share this machine's CPUs and disk.",
    ]
    problems = [
        f"! {m.name}: {m.errors} errors, first: {m.first_error}"
        for row in rows
        for m in (row.sessionlog, row.ceiling)
        if m.errors
    ]
    return "\n".join([header, "", table(rows), "", *notes, *dict.fromkeys(problems)])


def write_json(
    path: Path, rows: list[Row], settings: Settings, mode: str, info: dict[str, Any]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "mode": mode,
        "argv": sys.argv,
        "machine": info,
        "settings": asdict(settings),
        "rows": [row.to_json() for row in rows],
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
