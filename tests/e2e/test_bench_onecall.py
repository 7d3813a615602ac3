"""bench.onecall: every row is timed in turn, its appends are all stored, and --ab runs a
second server from another checkout beside this one's."""

from __future__ import annotations

from bench.onecall import measure
from bench.procs import REPO


def test_rows_are_timed_in_rounds_and_the_old_and_new_servers_sit_side_by_side() -> None:
    """Two rounds of five calls: each row holds ten timings and two round medians, the server
    rows read their server's CPU, and the checkout given as the old one runs its own server
    (here this same checkout, so both answer alike)."""
    rows = measure(rounds=2, calls=5, old_source=REPO)
    names = [row.name for row in rows]
    assert names == [
        "echo Unary",
        "echo UnaryViaThread",
        "GetSession (old)",
        "GetSession (new)",
        "Append 1 event (old)",
        "Append 1 event (new)",
        "bare py-lmdb synced commit",
    ]
    for row in rows:
        assert len(row.seconds) == 10
        assert len(row.round_medians) == 2
        assert all(taken > 0 for taken in row.seconds)
    assert all(row.pid is not None for row in rows[:-1])
    assert rows[-1].pid is None
    assert rows[-1].line().split()[-1] == "-"  # in this process: no server CPU to read
    assert rows[0].line().split()[-1].isdigit()  # a server's CPU per call, in µs
