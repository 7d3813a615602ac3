"""A short session's delete by the length of the change feed, in process (issue 35).

    .venv/bin/python -m bench.deletecost                       # feeds of 10k, 100k, 300k records
    .venv/bin/python -m bench.deletecost --records 100000 --rounds 5

A delete finds its session's old records in the change feed to rewrite them (``erasure``).
Found by walking the feed, that cost grew with every record ever written; found through the
feed's index (``feed_index``), with the session's own records. For each feed length the bench
writes that many one-event appends (to 1,000 sessions, in groups; ``--durability nosync`` for
the build only), with a 5-event session among the first records, then times, ``--rounds``
times each: the lookup through the index (``erasure.scan``), the walk it replaced (the same
function with the index set aside), and a whole delete of a fresh 5-event session written at
the start (lookup, then its write command on the writer). Medians, in ms.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import event
from sessionlog.defaults import NOSYNC
from sessionlog.storage import erasure, feed_index
from sessionlog.storage.preparing import prepare_append
from sessionlog.storage.store import Store, StoreConfig

GROUP = 500
"""Appends submitted before waiting for them (they share commits)."""


def fill(store: Store, records: int, victims: int) -> None:
    """``victims`` 5-event sessions first, then ``records`` one-event appends."""
    for n in range(victims):
        store.append(f"victim-{n}", [event() for _ in range(5)])
    pending = []
    for n in range(records):
        batch = prepare_append(f"s-{n % 1000}", [event()])
        pending.append(store.submit_append(batch))
        if len(pending) == GROUP:
            for future in pending:
                future.result()
            pending.clear()
    for future in pending:
        future.result()


def lookup_ms(store: Store, session_id: str, *, walk: bool) -> float:
    with store.env.begin() as txn:
        started = time.perf_counter()
        if walk:
            erasure._walk(txn, store.tables, {session_id}, 0)
        else:
            erasure.scan(txn, store.tables, [session_id])
        return (time.perf_counter() - started) * 1e3


def measure(records: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-deletecost-") as tmp:
        store = Store(Path(tmp) / "data", StoreConfig(durability=NOSYNC))
        try:
            fill(store, records, rounds)
            with store.env.begin() as txn:
                assert feed_index.complete(txn, store.tables)
            index = [lookup_ms(store, "victim-0", walk=False) for _ in range(rounds)]
            walked = [lookup_ms(store, "victim-0", walk=True) for _ in range(rounds)]
            deletes = []
            for n in range(rounds):
                started = time.perf_counter()
                store.delete(f"victim-{n}")
                deletes.append((time.perf_counter() - started) * 1e3)
        finally:
            store.close()
    return {
        "index": statistics.median(index),
        "walk": statistics.median(walked),
        "delete": statistics.median(deletes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", default="10000,100000,300000")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| feed records | lookup through the index (ms) | walk of the feed (ms) | delete (ms) |")
    print("| --- | --- | --- | --- |")
    for records in (int(n) for n in args.records.split(",")):
        row = measure(records, args.rounds)
        print(
            f"| {records:,} | {row['index']:.3f} | {row['walk']:.1f} | {row['delete']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
