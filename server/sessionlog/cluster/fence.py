"""The self-fence: until when a leader may take writes, on the monotonic clock.

A lease with TTL T that etcd renewed at the moment it received a keepalive lives until at least
that moment + T. The moment we *sent* the keepalive is earlier, so ``sent + T`` is a lower bound
on the lease's end that our own clock can compute. A leader stops writing at ``sent + T/2``:
another member can win only after the lease is gone (``>= sent + T``), so even a leader that was
frozen (SIGSTOP, a long pause) finds, when it wakes, that its deadline has passed, before it
answers anything. The margin of T/2 absorbs clock rate differences and the time between reading
the clock and the write's commit.

Invariant: the deadline only moves forward for one lease, only through a renewal whose response
said the lease is alive, and is computed from the time before the request was sent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class LeaseDeadline:
    """The write deadline for the current lease; ``alive()`` may be called from any thread."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock
        self._deadline = -math.inf

    @property
    def deadline(self) -> float:
        """The clock reading from which writes are refused (-inf: no live lease)."""
        return self._deadline

    def renewed(self, sent_at: float, granted_ttl: float) -> None:
        """A grant or keepalive sent at ``sent_at`` answered that the lease lives for
        ``granted_ttl`` seconds. etcd may grant more than asked (its floor); the shorter of the
        two is the safe one to halve."""
        if granted_ttl <= 0:
            return
        self._deadline = max(self._deadline, sent_at + min(self.ttl, granted_ttl) / 2)

    def reset(self) -> None:
        """The lease is gone (expired, revoked, replaced): no writes until a new one."""
        self._deadline = -math.inf

    def alive(self) -> bool:
        return self.clock() < self._deadline

    def remaining(self) -> float:
        """Seconds until the deadline (negative once passed)."""
        return self._deadline - self.clock()
