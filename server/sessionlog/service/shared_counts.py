"""What the workers of one server share: two 8-byte slots per worker in shared memory.

The first N slots hold each worker's open streams; the next N each worker's heartbeat (the
monotonic clock, in ns, which is the same clock in every process of the machine), written once
a second by its event loop: the supervisor kills a worker whose heartbeat stops (its loop is
frozen or stuck), and starts another.

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
import time

SLOT = struct.Struct("=q")


def make_counts(count: int) -> int:
    """A memfd of 2 x ``count`` zeroed slots (closed on exec unless handed down)."""
    fd = os.memfd_create("sessionlog-counts", os.MFD_CLOEXEC)
    os.ftruncate(fd, 2 * max(count, 1) * SLOT.size)
    return fd


class SharedCounts:
    """A worker's view of the slots (``slot`` is its own)."""

    def __init__(self, fd: int, count: int, slot: int) -> None:
        self._map = mmap.mmap(fd, 2 * count * SLOT.size)
        self._count = count
        self._slot = slot

    def publish(self, value: int) -> None:
        SLOT.pack_into(self._map, self._slot * SLOT.size, value)

    def beat(self) -> None:
        """Say this worker's loop is running (see the module docstring)."""
        SLOT.pack_into(self._map, (self._count + self._slot) * SLOT.size, time.monotonic_ns())

    def others(self) -> int:
        """The sum of every other worker's slot."""
        return sum(
            SLOT.unpack_from(self._map, slot * SLOT.size)[0]
            for slot in range(self._count)
            if slot != self._slot
        )


def clear(fd: int, count: int, slot: int) -> None:
    """Zero a dead worker's slots (the supervisor)."""
    os.pwrite(fd, SLOT.pack(0), slot * SLOT.size)
    os.pwrite(fd, SLOT.pack(0), (count + slot) * SLOT.size)


def last_beat(fd: int, count: int, slot: int) -> int:
    """A worker's last heartbeat (monotonic ns; 0 before its first)."""
    beat: int = SLOT.unpack(os.pread(fd, SLOT.size, (count + slot) * SLOT.size))[0]
    return beat
