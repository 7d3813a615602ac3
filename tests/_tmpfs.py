"""A small tmpfs mounted for one test, for filling a disk for real (no fake filesystem).

Mounting needs privileges: where the machine refuses, the test is skipped with the refusal.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

MOUNT_SECONDS = 30


@contextmanager
def small_tmpfs(mount_point: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes at ``mount_point`` (created), unmounted however the block ends.
    Stop every process using it before the block ends."""
    mount_point.mkdir(parents=True, exist_ok=True)
    command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)]
    try:
        mounted = subprocess.run(
            command, capture_output=True, text=True, timeout=MOUNT_SECONDS, check=False
        )
    except FileNotFoundError:
        pytest.skip("no mount command on this machine")
    if mounted.returncode != 0:
        pytest.skip(f"this machine does not allow mounting a tmpfs: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], timeout=MOUNT_SECONDS, check=True)


def fill(path: Path, size: int) -> None:
    """Write a filler file of ``size`` bytes (whole MiB): it takes real space on a tmpfs."""
    chunk = b"\0" * (1 << 20)
    with path.open("wb") as out:
        for _ in range(size // len(chunk)):
            out.write(chunk)
