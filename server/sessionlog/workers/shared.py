"""Counts the workers of one server share: one 8-byte slot per worker in shared memory.

The supervisor makes the memory (a memfd, handed down like the doorbells); each worker writes
only its own slot (an aligned 8-byte store: others never see half of it) and reads the others'
to know the server's total. The supervisor zeroes the slot of a worker that died. Used for the
server-wide stream limit (``--max-streams``): two workers admitting a stream at the same
instant may both see room for one, so the total can pass the limit by at most workers - 1.
"""

from __future__ import annotations

import mmap
import os
import struct

SLOT = struct.Struct("=q")


def make_counts(count: int) -> int:
    """A memfd of ``count`` zeroed slots (closed on exec unless handed down)."""
    fd = os.memfd_create("sessionlog-counts", os.MFD_CLOEXEC)
    os.ftruncate(fd, max(count, 1) * SLOT.size)
    return fd


class SharedCounts:
    """A worker's view of the slots (``slot`` is its own)."""

    def __init__(self, fd: int, count: int, slot: int) -> None:
        self._map = mmap.mmap(fd, count * SLOT.size)
        self._count = count
        self._slot = slot

    def publish(self, value: int) -> None:
        SLOT.pack_into(self._map, self._slot * SLOT.size, value)

    def others(self) -> int:
        """The sum of every other worker's slot."""
        return sum(
            SLOT.unpack_from(self._map, slot * SLOT.size)[0]
            for slot in range(self._count)
            if slot != self._slot
        )


def clear(fd: int, slot: int) -> None:
    """Zero a dead worker's slot (the supervisor)."""
    os.pwrite(fd, SLOT.pack(0), slot * SLOT.size)
