"""One election member as a process of its own, for the tests that freeze or kill it.

    python -m tests.cluster._member --cluster etcd://127.0.0.1:P --group g \
        --advertise 127.0.0.1:5001 --lease-ttl 3 --position 10

It writes JSON lines to stdout (the test points stdout at a file), each with ``t``, the
monotonic clock (CLOCK_MONOTONIC is one clock for every process of the machine, so lines of
different members compare):

    {"event": "role", "role": "lead", "epoch": 7, "address": "", "reason": "",
     "campaign_sent_at": t}
    {"event": "tick", "checked_at": t, "may_write": true, "epoch": 7, "deadline": t}
                                                                  every TICK_SECONDS

A tick is what a server's write path would do before it answers: ask ``may_write()``. SIGTERM
stops the member (it resigns) and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from typing import Any

from sessionlog.cluster.election import Fenced, Follow, Lead, Member, Role
from sessionlog.cluster.members import Progress
from sessionlog.cluster.settings import cluster_settings

TICK_SECONDS = 0.05


def _line(**fields: Any) -> None:
    sys.stdout.write(json.dumps({"t": time.monotonic(), **fields}) + "\n")
    sys.stdout.flush()


def role_fields(role: Role) -> dict[str, Any]:
    return {
        "role": type(role).__name__.lower(),
        "epoch": role.epoch if isinstance(role, Lead | Follow) else 0,
        "address": role.address if isinstance(role, Follow) else "",
        "reason": role.reason if isinstance(role, Fenced) else "",
    }


async def _run(member: Member) -> None:
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    member.start()

    async def report_roles() -> None:
        async for role in member.roles():
            _line(event="role", campaign_sent_at=member.campaign_sent_at, **role_fields(role))

    async def tick() -> None:
        while True:
            # ``t`` is read before the check: a SIGSTOP between the two must not date a check
            # made before the freeze after the wake.
            checked_at = time.monotonic()
            may_write = member.may_write()
            _line(
                event="tick",
                checked_at=checked_at,
                may_write=may_write,
                epoch=member.leading_epoch() or 0,
                deadline=member.fence.deadline if member.fence.deadline > 0 else 0,
            )
            await asyncio.sleep(TICK_SECONDS)

    tasks = [asyncio.create_task(report_roles()), asyncio.create_task(tick())]
    await stopping.wait()
    tasks[1].cancel()
    await member.stop()
    await asyncio.wait_for(tasks[0], 5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--advertise", required=True)
    parser.add_argument("--lease-ttl", type=int, required=True)
    parser.add_argument("--position", type=int, default=0)
    args = parser.parse_args()
    settings = cluster_settings(args.cluster, args.group, args.advertise, args.lease_ttl)
    assert settings is not None
    asyncio.run(_run(Member(settings, progress=Progress(0, args.position))))


if __name__ == "__main__":
    main()
