"""Case 13's table and targets (bench.report) from made-up measurements: no server, no socket."""

from __future__ import annotations

from bench.common import Measurement
from bench.report import Results, StreamRow, stream_table, stream_targets, targets


def measured(name: str, events: int, calls: int, **details: object) -> Measurement:
    m = Measurement(name, events=events, calls=calls, seconds=1.0, client_cpu_seconds=0.1)
    m.details.update(details)
    return m


PUT = measured("etcd Put 1 key, 16 clients (h2load)", 2_000, 2_000, puts_per_call=1)
TXN = measured("etcd Txn of 100 Puts, 4 clients (h2load)", 30_000, 300, puts_per_call=100)


def rows() -> list[StreamRow]:
    return [
        StreamRow(
            "AppendStream 1 ev, 16 streams x 16 in flight",
            measured("s1", 1_000, 1_000, mode="stream"),
            measured("s2", 2_500, 2_500, mode="stream"),
            PUT,
        ),
        StreamRow(
            "Append 1 ev, 16 unary callers",
            measured("u1", 500, 500, mode="unary"),
            measured("u2", 400, 400, mode="unary"),
            PUT,
        ),
        StreamRow(
            "AppendStream 100 ev, 4 streams x 16 in flight",
            measured("b1", 33_000, 330, mode="stream"),
            measured("b2", 36_000, 360, mode="stream"),
            TXN,
        ),
    ]


def test_targets_set_each_stream_row_beside_etcd_and_two_workers_beside_one() -> None:
    """Stream rows are held to etcd at both worker counts; every row to one worker; the unary
    row has no etcd target."""
    found = {t.what: (t.measured, t.met) for t in stream_targets(rows())}

    assert found == {
        "AppendStream 1 ev, 16 streams x 16 in flight, --workers 1 vs etcd Put 1 key, 16 clients": (
            "0.50x",
            False,
        ),
        "AppendStream 1 ev, 16 streams x 16 in flight, --workers 2 vs etcd Put 1 key, 16 clients": (
            "1.25x",
            True,
        ),
        "AppendStream 100 ev, 4 streams x 16 in flight, --workers 1 vs etcd Txn of 100 Puts, "
        "4 clients": ("1.10x", True),
        "AppendStream 100 ev, 4 streams x 16 in flight, --workers 2 vs etcd Txn of 100 Puts, "
        "4 clients": ("1.20x", True),
        "AppendStream 1 ev, 16 streams x 16 in flight: --workers 2 vs 1": ("2.50x", True),
        "Append 1 ev, 16 unary callers: --workers 2 vs 1": ("0.80x", False),
        "AppendStream 100 ev, 4 streams x 16 in flight: --workers 2 vs 1": ("1.09x", True),
    }
    assert all(
        t in targets(Results([], [], [], [], streams=rows())) for t in stream_targets(rows())
    )


def test_a_row_without_etcd_has_no_peer_target_and_the_table_shows_each_peer_once() -> None:
    """Without etcd (not installed) a stream row is held to one worker only; a peer shared by
    two rows is one line of the table."""
    alone = [StreamRow(r.case, r.one, r.many) for r in rows()]

    assert [t.what for t in stream_targets(alone)] == [f"{r.case}: --workers 2 vs 1" for r in alone]
    shown = stream_table(rows())
    assert shown.count("  etcd Put 1 key, 16 clients (h2load)") == 1
    assert shown.count("  etcd Txn of 100 Puts, 4 clients (h2load)") == 1
    assert "AppendStream 1 ev, 16 streams x 16 in flight" in shown


def test_the_live_tail_targets_are_issue_33s_5_ms_for_one_follower_and_20_for_100() -> None:
    """Case 5 on the main server is held to issue 33's goals: a p99 of 12 ms misses with one
    follower and meets with 100."""
    tails = [
        measured("5 tail, 1", 1_000, 1_000, followers=1, ack_to_arrival_p99_ms=12.0),
        measured("5 tail, 100", 1_000, 1_000, followers=100, ack_to_arrival_p99_ms=12.0),
    ]
    found = {t.what: t for t in targets(Results(rows=[], tails=tails, derives=[], notes=[]))}
    one = found["live tail p99 ack->arrival, 1 follower(s)"]
    many = found["live tail p99 ack->arrival, 100 follower(s)"]
    assert (one.goal, one.met) == ("<= 5 ms", False)
    assert (many.goal, many.met) == ("<= 20 ms", True)
