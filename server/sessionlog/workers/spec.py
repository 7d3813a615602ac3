"""What the supervisor hands a worker it starts (pickled on the worker's stdin)."""

from __future__ import annotations

from dataclasses import dataclass

from sessionlog.config import ServerConfig


@dataclass(frozen=True)
class WorkerSpec:
    config: ServerConfig
    """The server's settings, with the ports the supervisor reserved and this worker's share
    of the server-wide stream limits."""
    slot: int
    count: int
    bells: tuple[int, ...]
    """Every slot's eventfd (inherited): see ``service.doorbell``."""
    counts_fd: int
    """The shared stream counts (inherited): see ``service.shared_counts``."""
    lock_fd: int
    """The folder lock's descriptor (inherited): see ``storage.folder``."""
    ready_fd: int
    """The pipe on which the worker says ``ready`` once serving, or why it could not start."""
    supervisor_pid: int
    log_level: str
    log_format: str
