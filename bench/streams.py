"""Case 13 (issue 33): pipelined appends over AppendStream beside etcd, at one worker and at two.

Every row is driven by the compiled ``appendload`` (``bench.appendload``), on the main server
(``--workers 1``) and on a second server of two workers on a data folder of its own:

- AppendStream of one event, 16 streams each keeping ``stream_window`` appends in flight, beside
  etcd's Put of one key from 16 h2load clients (the etcd group's row, ``bench.etcd.PUTS``);
- unary Append of one event from 16 callers, one call in flight each: the same client without
  the pipelining, beside the same Put;
- AppendStream of 100 events, 4 streams, beside etcd's Txn of 100 Puts from 4 clients
  (``bench.etcd.TXNS``).

etcd's rows come from the etcd group when it ran in the same run, else they are measured here
(etcd started for them alone; without etcd or h2load the rows stand without a peer). The
AppendStream row of one event also stands beside etcd's Put with as many calls in flight per
client as each stream keeps (h2load's ``-m``): not issue 33's target, but the pipelined peer.
Each case runs ``Settings.workers_duration`` (as the ``--workers`` group's cases do), so that
the default run stays within its budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from bench import appendload, etcd, procs
from bench.common import Measurement, Settings
from bench.report import StreamRow

WORKERS = 2
"""The second server's workers: issue 33 asks for --workers 2 never slower than one."""


def load_cases(settings: Settings) -> list[tuple[appendload.LoadCase, etcd.WriteCase]]:
    """Each appendload case with the etcd case it stands beside."""
    window = settings.stream_window
    return [
        (appendload.LoadCase("stream", 16, window, 1), etcd.PUTS),
        (appendload.LoadCase("unary", 16, 1, 1), etcd.PUTS),
        (appendload.LoadCase("stream", 4, window, 100), etcd.TXNS),
    ]


def run_group(
    settings: Settings,
    work: Path,
    single: procs.ServerProcess,
    peers: dict[int, Measurement],
    progress: Callable[[str], None],
) -> list[StreamRow]:
    """Build appendload, start a server of two workers (and etcd when its rows are missing),
    measure every case at one worker and at two."""
    progress("building bench/go/appendload (offline, GOPATH mode)")
    binary = appendload.build(work)
    peer = dict(peers)
    wanted = {c.puts_per_call: c for _, c in load_cases(settings) if c.puts_per_call not in peer}
    settings = replace(settings, duration=settings.workers_duration or settings.duration)
    pipelined = None
    if not etcd.unavailable():
        progress(f"starting etcd ({etcd.version() or 'etcd'}) for the rows beside AppendStream")
        with etcd.etcd_server(work / "etcd-streams") as peer_etcd:
            for puts, write in wanted.items():
                progress(write.label)
                peer[puts] = etcd.run_writes(settings, peer_etcd, write, work)
            write = etcd.pipelined_puts(settings.stream_window)
            progress(write.label)
            pipelined = etcd.run_writes(settings, peer_etcd, write, work)
    progress(f"starting sessionlog --workers {WORKERS} for the AppendStream rows")
    with procs.sessionlog_server(
        work / f"data-streams-{WORKERS}", work / "server-streams.log", workers=WORKERS
    ) as double:
        return measure_rows(binary, settings, work, single, double, peer, progress, pipelined)


def measure_rows(
    binary: Path,
    settings: Settings,
    work: Path,
    single: procs.ServerProcess,
    double: procs.ServerProcess,
    peers: dict[int, Measurement],
    progress: Callable[[str], None],
    pipelined: Measurement | None = None,
) -> list[StreamRow]:
    """Every case on ``single`` and on ``double``, each beside its etcd row from ``peers`` (by
    puts per call; None when missing); the AppendStream row of one event also beside
    ``pipelined``, etcd's Put with calls in flight."""
    rows = []
    for case, write in load_cases(settings):
        measured = []
        for server in (single, double):
            progress(f"case 13 {case.label} (appendload, --workers {server.workers})")
            measured.append(appendload.run(binary, settings, server, case, work))
        rows.append(
            StreamRow(
                case.label,
                measured[0],
                measured[1],
                peers.get(write.puts_per_call),
                pipelined if case.mode == "stream" and case.events_per_append == 1 else None,
            )
        )
    return rows
