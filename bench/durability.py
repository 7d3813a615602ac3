"""What each ``--durability`` mode costs and buys: the same append loads on a server per mode.

For every mode the server accepts, a fresh ``sessionlog serve --workers 1 --durability MODE``
takes case 1 (one client, one call at a time) and case 2 (16 clients) through h2load, one event
per call. Each row shows appends/s, the server's CPU per append and, from its metrics, the
writer's commits and commands per group commit. The rows stand beside ``sync`` (the default):
the ratio is what a mode gains over it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench import cases, h2load, procs
from bench.common import Measurement, Settings
from bench.report import Row

MODES = ("sync", "group", "nosync")
"""Every mode, the default first (the rows' reference)."""

LOADS = (cases.SEQUENTIAL, cases.CONCURRENT)


def unavailable() -> str:
    """Why the group cannot run here ("" when it can): it drives every row with h2load."""
    return "" if h2load.executable() else h2load.unavailable()


def run_group(settings: Settings, parent: Path, progress: Callable[[str], None]) -> list[Row]:
    """One row per load and mode other than sync: the mode beside sync, measured in this run."""
    measured: dict[tuple[str, int], Measurement] = {}
    for mode in MODES:
        work = Path(tempfile.mkdtemp(prefix=f"durability-{mode}-", dir=parent))
        try:
            with procs.sessionlog_server(
                work / "data", work / "server.log", ["--durability", mode], workers=1
            ) as server:
                for case in LOADS:
                    _, measurement = cases.run_append_h2load(settings, server, case, work)
                    measurement.name = f"{case.label}, --durability {mode}"
                    measurement.details["durability"] = mode
                    measured[(mode, case.number)] = measurement
                    progress(f"  {measurement.name}: {_summary(measurement)}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    rows = []
    for case in LOADS:
        reference = measured[("sync", case.number)]
        for mode in MODES[1:]:
            label = f"D{case.number} durability {mode}: {case.label} (h2load)"
            rows.append(Row(label, measured[(mode, case.number)], reference, "sync"))
    return rows


def _summary(measurement: Measurement) -> str:
    per_append = (
        f", server CPU {measurement.server_cpu_seconds / measurement.calls * 1e6:,.0f} us/append"
        if measurement.server_cpu_seconds is not None and measurement.calls
        else ""
    )
    writer = measurement.details.get("writer") or {}
    groups = ""
    if writer:
        extra = writer["syncs"] / writer["commits"] if writer["commits"] else 0.0
        groups = (
            f", {writer['commands_per_group']:.1f} appends/commit, commit "
            f"{writer['commit_ms']:.2f} ms, {extra:.2f} extra syncs/commit"
        )
    return f"{measurement.events_per_second:,.0f} appends/s{per_append}{groups}"
