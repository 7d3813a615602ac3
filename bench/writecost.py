"""Writer and event-loop CPU per append in process, by commit-group size (issue 33).

    .venv/bin/python -m bench.writecost                       # 1, 4 and 16 tasks, 3 s each
    .venv/bin/python -m bench.writecost --durability sync --tasks 4,16 --seconds 5
    .venv/bin/python -m bench.writecost --events 100 --tasks 4     # case 3's appends, in process

No gRPC and no other process: N asyncio tasks each await one append (of one event, or of
``--events``) after another through ``Store.commit_append`` on a store in a temp dir, so the
writer's commit groups hold about N appends. The loop is the server's (uvloop, where installed:
``sessionlog.startup``): on asyncio's own loop the writer's ``call_soon_threadsafe`` is a socket
send that lets the loop's thread take the GIL in the middle of the writer's hand-off, which the
server never pays. The CPU of the writer thread and of the loop's thread (user + system, from
``/proc/self/task``) is read around each run. Between task counts, what a commit group costs
(taking it, the transaction, the sync, handing the replies to the loop, the loop's wakeup)
separates from what each append costs: ``split`` fits ``cost per append = fixed / appends per
commit + per append`` to two runs. docs/benchmarks.md (issue 33) has figures and what they say.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import event
from sessionlog.defaults import DURABILITY_MODES
from sessionlog.storage.preparing import prepare_append
from sessionlog.storage.store import Store, StoreConfig
from sessionlog.v1.event_pb2 import Event

SWITCH_INTERVAL = 0.0005
"""The server's GIL switch interval (``sessionlog.startup``), so the threads share it alike."""


@dataclass(frozen=True)
class WriteCost:
    """One run: how many appends, in how many commits, and each thread's CPU per append."""

    tasks: int
    appends: int
    commits: int
    seconds: float
    writer_us: float
    """The writer thread's CPU per append, µs."""
    loop_us: float
    """The loop thread's CPU per append (preparing, submitting, resolving), µs."""

    @property
    def per_commit(self) -> float:
        return self.appends / self.commits if self.commits else 0.0


def split(small: WriteCost, large: WriteCost) -> tuple[float, float]:
    """(µs per commit group, µs per append) of the writer thread, from two runs whose groups
    differ in size: the line through (1 / appends per commit, CPU per append) of each."""
    x1, x2 = 1 / small.per_commit, 1 / large.per_commit
    if x1 == x2:
        raise ValueError("the two runs have the same appends per commit")
    fixed = (small.writer_us - large.writer_us) / (x1 - x2)
    return fixed, small.writer_us - fixed * x1


def _thread_cpu(native_id: int) -> float:
    """A thread of this process: its user + system CPU seconds so far."""
    text = Path(f"/proc/self/task/{native_id}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _run(store: Store, tasks: int, seconds: float, events: int) -> WriteCost:
    writer_thread = store.writer._thread.native_id
    assert writer_thread is not None
    loop_thread = _current_native_id()
    batch = [event()] * events
    await asyncio.gather(*(_append(store, f"w{i}", batch) for i in range(tasks)))  # they exist
    appended = [0] * tasks
    deadline = time.monotonic() + seconds

    async def client(index: int) -> None:
        while time.monotonic() < deadline:
            await _append(store, f"w{index}", batch)
            appended[index] += 1

    commits = store.writer.stats.commits
    writer_cpu, loop_cpu = _thread_cpu(writer_thread), _thread_cpu(loop_thread)
    started = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(tasks)))
    elapsed = time.perf_counter() - started
    count = sum(appended)
    return WriteCost(
        tasks=tasks,
        appends=count,
        commits=store.writer.stats.commits - commits,
        seconds=elapsed,
        writer_us=(_thread_cpu(writer_thread) - writer_cpu) / max(1, count) * 1e6,
        loop_us=(_thread_cpu(loop_thread) - loop_cpu) / max(1, count) * 1e6,
    )


async def _append(store: Store, session_id: str, batch: list[Event]) -> None:
    await store.commit_append(prepare_append(session_id, batch))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The server's event loop: uvloop's where it is installed, else asyncio's (None)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _current_native_id() -> int:
    native = threading.current_thread().native_id
    assert native is not None
    return native


def measure(
    tasks: int, seconds: float, durability: str, parent: str | None = None, events: int = 1
) -> WriteCost:
    """One run of ``tasks`` appending tasks for ``seconds`` on a fresh store, ``events`` events
    per append."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        with tempfile.TemporaryDirectory(prefix="writecost-", dir=parent) as data:
            store = Store(data, StoreConfig(durability=durability))
            try:
                with asyncio.Runner(loop_factory=_loop_factory()) as runner:
                    return runner.run(_run(store, tasks, seconds, events))
            finally:
                store.close()
    finally:
        sys.setswitchinterval(previous)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="1,4,16", help="comma-separated task counts")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--durability", choices=DURABILITY_MODES, default="nosync")
    parser.add_argument("--tmp-dir", default=None, help="parent of the stores' temp dirs")
    parser.add_argument("--events", type=int, default=1, help="events per append")
    args = parser.parse_args(argv)
    runs = [
        measure(int(n), args.seconds, args.durability, args.tmp_dir, args.events)
        for n in args.tasks.split(",")
    ]
    print(
        f"--durability {args.durability}, {args.events} events per append, "
        f"{args.seconds:g} s per run"
    )
    print("tasks  appends/s  per commit  writer µs/append  loop µs/append")
    for run in runs:
        print(
            f"{run.tasks:5d}  {run.appends / run.seconds:9.0f}  {run.per_commit:10.1f}  "
            f"{run.writer_us:15.0f}  {run.loop_us:14.0f}"
        )
    if len(runs) >= 2 and runs[0].per_commit != runs[-1].per_commit:
        fixed, each = split(runs[0], runs[-1])
        print(f"writer thread: about {fixed:.0f} µs per commit group and {each:.0f} µs per append")
    return 0


if __name__ == "__main__":
    sys.exit(main())
