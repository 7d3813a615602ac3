"""Run every benchmark and its ceiling, print one table, write it as JSON.

    python -m bench [--quick] [--json PATH] [--duration SECONDS] [--client-procs N]

The default run takes a few minutes (hard limit 9 minutes), ``--quick`` under two. Everything runs
on 127.0.0.1 in a temp dir that is removed at the end, and every process started here is stopped
by its PID, on failure too.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from types import FrameType

from bench import cases, ceilings, procs
from bench.common import Measurement, Settings
from bench.report import Row, machine, render, write_json

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"


class BudgetExceeded(Exception):
    """The run went past its time budget."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs, under two minutes")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write results")
    parser.add_argument(
        "--duration", type=float, help="measured seconds per timed case (0.5 to 30)"
    )
    parser.add_argument("--client-procs", type=int, help="processes for the concurrent load")
    parser.add_argument("--tmp-dir", type=Path, help="parent of the temp dir (data, logs, LMDB)")
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    settings = Settings.quick() if args.quick else Settings.default()
    if args.duration is not None:
        settings = replace(settings, duration=min(max(args.duration, 0.5), 30.0))
    if args.client_procs is not None:
        settings = replace(settings, client_processes=min(max(args.client_procs, 1), 16))
    return settings


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measured(label: str, measurement: Measurement) -> Measurement:
    extra = f", {measurement.errors} errors" if measurement.errors else ""
    progress(
        f"  {label}: {measurement.events_per_second:,.0f} ev/s "
        f"(client {measurement.client_cores:.2f} cores{extra})"
    )
    return measurement


def run_all(settings: Settings, work: Path) -> list[Row]:
    """Start both servers, run each case next to its ceilings, stop the servers."""
    with ExitStack() as stack:
        progress("starting sessionlog and echo servers")
        server = stack.enter_context(procs.sessionlog_server(work / "data", work / "server.log"))
        echo = stack.enter_context(procs.echo_server(work / "echo.log"))
        rows: list[Row] = []

        for case in (cases.SEQUENTIAL, cases.CONCURRENT, cases.BATCHED):
            progress(f"case {case.label}")
            load, result = cases.run_append(settings, server, case)
            measured("sessionlog", result)
            echo_result = measured("echo", ceilings.echo_unary(load, echo))
            if case is cases.BATCHED:
                lmdb = measured("lmdb", ceilings.lmdb_commits(settings, work, 100))
                rows.append(Row(case.label, result, lmdb))
            rows.append(Row(case.label, result, echo_result))
            if case is cases.SEQUENTIAL:
                lmdb = measured("lmdb", ceilings.lmdb_commits(settings, work, 1))
                rows.append(Row(case.label, result, lmdb))
                rows.append(Row(case.label, result, ceilings.in_series(echo_result, lmdb)))

        progress(f"case 4 since catch-up ({settings.since_events:,} events)")
        result = measured("sessionlog", cases.since_catch_up(settings, server))
        rows.append(
            Row(result.name, result, measured("echo", ceilings.echo_stream(settings, echo)))
        )
        progress("stopping servers")
    return rows


@contextmanager
def time_budget(seconds: float) -> Iterator[None]:
    """Raise BudgetExceeded in the main thread once ``seconds`` have passed; SIGTERM interrupts."""

    def expired(signum: int, frame: FrameType | None) -> None:
        raise BudgetExceeded(f"the run exceeded its {seconds:.0f} s budget")

    def terminated(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, expired), signal.signal(signal.SIGTERM, terminated)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    mode = "quick" if args.quick else "default"
    started = time.perf_counter()
    info = machine()
    work = Path(tempfile.mkdtemp(prefix="sessionlog-bench-", dir=args.tmp_dir))
    try:
        with time_budget(settings.budget_seconds):
            rows = run_all(settings, work)
    except (BudgetExceeded, procs.ServerFailed, RuntimeError) as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench interrupted", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(render(rows, settings, mode, info))
    write_json(args.json, rows, settings, mode, info)
    progress(f"done in {time.perf_counter() - started:.0f} s; wrote {args.json}")
    failed = any(m.errors for row in rows for m in (row.sessionlog, row.ceiling))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
