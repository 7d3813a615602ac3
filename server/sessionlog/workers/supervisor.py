"""The supervisor of ``sessionlog serve --workers N`` (see the package docstring).

It serves no call itself. In order, it:

1. takes the data folder's lock (a second server is refused here, as a single one is);
2. opens the store once and closes it: the damage checks and the history reconciliation run
   once, before any worker (workers open the folder ``prepared``: see ``storage.store.Store``);
3. reserves the gRPC and HTTP ports (``ports``) and makes the doorbells (``service.doorbell``) and a
   fresh metrics folder (prometheus_client's multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR``);
4. starts N workers, fresh interpreters (``python -m sessionlog.workers.worker``) that inherit
   the lock, the bells and a pipe on which each says ``ready``; if one cannot start, it stops
   the others and the server does not start (exit 1, the worker's reason on stderr);
5. restarts a worker that exits on its own, after a pause that grows while it keeps failing
   (its in-flight calls failed with it; what it acknowledged is durable in LMDB), with one log
   line naming the worker and how it ended;
6. on SIGTERM or SIGINT, stops restarting, passes SIGTERM to every worker (each drains within
   the shutdown grace) and SIGKILLs any still running a few seconds after the grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import multiprocess

from sessionlog.config import ServerConfig, worker_count
from sessionlog.server import index_old_sessions, store_config
from sessionlog.service import doorbell, shared_counts
from sessionlog.startup import CannotStart
from sessionlog.storage import folder
from sessionlog.storage.store import Store
from sessionlog.workers import ports
from sessionlog.workers.spec import WorkerSpec

log = logging.getLogger(__name__)

READY_SECONDS = 60.0
"""How long a worker may take to start serving."""
KILL_AFTER_GRACE_SECONDS = 5.0
"""How long past the shutdown grace a worker may take to exit before it is killed."""
UNRESPONSIVE_SECONDS = 15.0
"""A worker whose event loop has not beaten for this long is killed and replaced."""
FIRST_RESTART_PAUSE = 0.1
LONGEST_RESTART_PAUSE = 5.0
STEADY_SECONDS = 30.0
"""A worker that ran this long before it died is restarted after the first pause again."""


METRICS_PREFIX = "sessionlog-metrics-"
"""The metrics folders in the temp folder are named METRICS_PREFIX + supervisor PID + "-"."""


class WorkersFailed(CannotStart):
    """A worker could not start; the message is its reason."""


@dataclass
class _Worker:
    slot: int
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    failures: int = 0
    """Exits in a row, each soon after its start (the restart pause grows with them)."""


class Supervisor:
    """Start, watch and stop the worker processes of one server."""

    def __init__(self, config: ServerConfig, log_level: str = "info", log_format: str = "auto"):
        self.config = config
        self.count = worker_count(config)
        self._log_level, self._log_format = log_level, log_format
        self._workers = [_Worker(slot) for slot in range(self.count)]
        self._stopping = asyncio.Event()
        self._lock: folder.FolderLock | None = None
        self._reservations: list[ports.Reservation] = []
        self._bells: list[int] = []
        self._counts = -1
        self._metrics_dir = ""
        self._worker_config = config
        self._watchers: set[asyncio.Task[None]] = set()
        self.port = 0

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT; raises what stops the server from starting."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        try:
            await self._prepare()
            await self._start_all()
            self._log_serving()
            watchdog = asyncio.create_task(self._watch_heartbeats())
            await self._stopping.wait()
            watchdog.cancel()
            log.info("stopping on signal", extra={"workers": self.count})
            await self._stop_all()
            log.info("sessionlog stopped")
        finally:
            self._release()

    # -- start ----------------------------------------------------------------------------------

    async def _prepare(self) -> None:
        config = self.config
        path = Path(config.data_dir)
        self._lock = folder.acquire(path)
        # The checks may read the whole file: off the loop, so signals are still answered.
        store = await asyncio.to_thread(Store, path, store_config(config), lock=self._lock)
        await asyncio.to_thread(index_old_sessions, store, config)
        await asyncio.to_thread(store.close)
        wanted = [(config.listen, "--listen")]
        if config.http_listen:
            wanted.append((config.http_listen, "--http-listen"))
        if config.metrics_listen and config.metrics_listen != config.http_listen:
            wanted.append((config.metrics_listen, "--metrics-listen"))
        self._reservations = ports.reserve(wanted)
        held = {flag: r.address for (_, flag), r in zip(wanted, self._reservations, strict=True)}
        listen = held["--listen"]
        http = held.get("--http-listen", "")
        # --metrics-listen equal to --http-listen: served by the console's site (HttpSites).
        metrics = held.get("--metrics-listen", http if config.metrics_listen else "")
        self.port = ports.split(listen)[1]
        self._bells = doorbell.make_bells(self.count)
        self._counts = shared_counts.make_counts(self.count)
        _remove_orphaned_metrics()
        self._metrics_dir = tempfile.mkdtemp(prefix=f"{METRICS_PREFIX}{os.getpid()}-")
        self._worker_config = dataclasses.replace(
            config,
            listen=listen,
            http_listen=http,
            metrics_listen=metrics,
            workers=self.count,
            # The send rate is shared out (each worker paces its own streams); --max-streams is
            # counted over every worker (``service.shared_counts``).
            follow_send_rate=math.ceil(config.follow_send_rate / self.count),
        )

    async def _start_all(self) -> None:
        started = await asyncio.gather(
            *(self._start(worker) for worker in self._workers), return_exceptions=True
        )
        failures = [outcome for outcome in started if isinstance(outcome, BaseException)]
        if failures:
            await self._stop_all()
            raise failures[0]
        for worker in self._workers:
            self._watch(worker)

    async def _start(self, worker: _Worker) -> None:
        """Start ``worker``'s process and wait until it serves; WorkersFailed if it cannot."""
        assert self._lock is not None
        ready_read, ready_write = os.pipe()
        spec = WorkerSpec(
            config=self._worker_config,
            slot=worker.slot,
            count=self.count,
            bells=tuple(self._bells),
            counts_fd=self._counts,
            lock_fd=self._lock.fd,
            ready_fd=ready_write,
            supervisor_pid=os.getpid(),
            log_level=self._log_level,
            log_format=self._log_format,
        )
        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=self._metrics_dir)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "sessionlog.workers.worker",
                stdin=asyncio.subprocess.PIPE,
                pass_fds=(self._lock.fd, ready_write, self._counts, *self._bells),
                env=env,
                # Its own session: a terminal's ^C reaches the supervisor alone, which then
                # stops the workers in order.
                start_new_session=True,
            )
        except BaseException as exc:
            os.close(ready_read)
            if isinstance(exc, OSError):  # no process could be made (EAGAIN, ENOMEM, ...)
                raise WorkersFailed(
                    f"worker {worker.slot} could not start: no process could be made ({exc})"
                ) from None
            raise
        finally:
            os.close(ready_write)
        worker.process, worker.started_at = process, time.monotonic()
        try:
            assert process.stdin is not None
            process.stdin.write(pickle.dumps(spec))
            await process.stdin.drain()
            process.stdin.close()
            said = await _read_line(ready_read, READY_SECONDS)
        except (OSError, TimeoutError):
            said = ""
        finally:
            os.close(ready_read)
        if said == "ready":
            return
        await _end(process, 0)
        reason = said or f"it ended with {_how(process.returncode)} before serving"
        raise WorkersFailed(f"worker {worker.slot} could not start: {reason}")

    def _log_serving(self) -> None:
        config = self._worker_config
        log.info(
            "sessionlog serving",
            extra={
                "listen": config.listen,
                "port": self.port,
                "data": str(Path(config.data_dir).absolute()),
                "role": "primary",
                "tls": "mutual" if config.tls_client_ca else "on" if config.tls_cert else "off",
                "auth": "on" if config.auth_tokens else "off",
                "workers": self.count,
                "pids": [w.process.pid for w in self._workers if w.process is not None],
                "http": config.http_listen or "off",
                "metrics": config.metrics_listen or "off",
            },
        )

    # -- watch ----------------------------------------------------------------------------------

    def _watch(self, worker: _Worker) -> None:
        task = asyncio.get_running_loop().create_task(self._keep(worker))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _keep(self, worker: _Worker) -> None:
        """Restart ``worker`` each time it exits, until the server stops."""
        while True:
            process = worker.process
            assert process is not None
            code = await process.wait()
            # It may have died between a commit and ringing the others' bells for it.
            doorbell.ring(self._bells)
            if self._stopping.is_set():
                return
            ran = time.monotonic() - worker.started_at
            worker.failures = 1 if ran >= STEADY_SECONDS else worker.failures + 1
            pause = min(FIRST_RESTART_PAUSE * 2 ** (worker.failures - 1), LONGEST_RESTART_PAUSE)
            log.error(
                "worker exited; restarting it",
                extra={
                    "worker": worker.slot,
                    "pid": process.pid,
                    "exit": _how(code),
                    "ran_seconds": round(ran, 3),
                    "restart_in_seconds": pause,
                },
            )
            _forget_metrics_of(process.pid, self._metrics_dir)
            shared_counts.clear(self._counts, self.count, worker.slot)  # its streams ended with it
            while not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await self._stopping.wait()
                if self._stopping.is_set():
                    return
                try:
                    await self._start(worker)
                except Exception as exc:  # WorkersFailed, or a bug: keep the slot alive
                    worker.failures += 1
                    pause = min(pause * 2, LONGEST_RESTART_PAUSE)
                    log.error(
                        "worker could not restart; trying again",
                        extra={"worker": worker.slot, "error": str(exc), "retry_in_seconds": pause},
                    )
                    continue
                log.info(
                    "worker restarted",
                    extra={"worker": worker.slot, "pid": worker.process and worker.process.pid},
                )
                break

    async def _watch_heartbeats(self) -> None:
        """Kill a worker whose event loop has not run for UNRESPONSIVE_SECONDS (frozen by
        SIGSTOP, stuck in a call that never returns): its connections would hang, unseen.
        ``_keep`` then starts another."""
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic_ns()
            for worker in self._workers:
                process = worker.process
                if process is None or process.returncode is not None:
                    continue
                beat = shared_counts.last_beat(self._counts, self.count, worker.slot)
                silent = (now - beat) / 1e9
                if beat and silent > UNRESPONSIVE_SECONDS:
                    log.error(
                        "worker is not responding; killing it",
                        extra={
                            "worker": worker.slot,
                            "pid": process.pid,
                            "silent_seconds": round(silent, 1),
                        },
                    )
                    shared_counts.clear(self._counts, self.count, worker.slot)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.pid, signal.SIGKILL)

    # -- stop -----------------------------------------------------------------------------------

    async def _stop_all(self) -> None:
        """SIGTERM to every worker; SIGKILL to those still running past the grace."""
        self._stopping.set()
        deadline = self.config.shutdown_grace_seconds + KILL_AFTER_GRACE_SECONDS
        await asyncio.gather(
            *(_end(w.process, deadline) for w in self._workers if w.process is not None)
        )
        for task in list(self._watchers):
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    def _release(self) -> None:
        for reservation in self._reservations:
            reservation.close()
        self._reservations.clear()
        if self._counts >= 0:
            os.close(self._counts)
            self._counts = -1
        for fd in self._bells:
            os.close(fd)
        self._bells = []
        if self._metrics_dir:
            shutil.rmtree(self._metrics_dir, ignore_errors=True)
            self._metrics_dir = ""
        if self._lock is not None:
            self._lock.release()
            self._lock = None


async def _end(process: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM ``process`` and wait up to ``grace`` seconds for it; then SIGKILL it."""
    if process.returncode is None:
        _signal(process, signal.SIGTERM if grace else signal.SIGKILL)
        try:
            async with asyncio.timeout(grace or 5.0):
                await process.wait()
            return
        except TimeoutError:
            log.warning("worker did not stop in time; killing it", extra={"pid": process.pid})
        _signal(process, signal.SIGKILL)
        await process.wait()


def _signal(process: asyncio.subprocess.Process, signum: int) -> None:
    """Signal a worker that asyncio has not yet seen exit. Never ``process.send_signal``: that
    polls the child first (``Popen.poll``), which reaps one that has just exited before
    asyncio's child watcher does, so the watcher reports exit code 255 and warns "Unknown child
    process" instead of how the worker really ended. The PID is free again only from the
    watcher's reaping to asyncio's noting it, one turn of the loop: far too soon for the
    kernel, which hands PIDs out in turn, to give it to another process."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)


async def _read_line(fd: int, seconds: float) -> str:
    """The first line written to the pipe ``fd`` ("" when its writers all close it first)."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    done: asyncio.Future[None] = loop.create_future()
    chunks: list[bytes] = []

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        chunks.append(chunk)
        if (not chunk or b"\n" in chunk) and not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        async with asyncio.timeout(seconds):
            await done
    finally:
        loop.remove_reader(fd)
    return b"".join(chunks).decode(errors="replace").split("\n", 1)[0].strip()


def _how(code: int | None) -> str:
    if code is None:
        return "no exit yet"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def _remove_orphaned_metrics() -> None:
    """Remove the metrics folders of supervisors that are gone (killed before they could)."""
    for path in Path(tempfile.gettempdir()).glob(f"{METRICS_PREFIX}*-*"):
        pid = path.name[len(METRICS_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


def _forget_metrics_of(pid: int, metrics_dir: str) -> None:
    """Drop a dead worker's live gauges from the summed metrics (its counters stay)."""
    if metrics_dir:
        multiprocess.mark_process_dead(pid, metrics_dir)  # type: ignore[no-untyped-call]
