"""`python -m bench.turn_writes` (docs/frameworks/index.md): each way writes every item of every
turn it times, and the printout names each way with its p50 and p99."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench import procs, turn_writes
from sessionlog_client import Client


def test_each_way_writes_every_item_of_every_turn(tmp_path: Path) -> None:
    turns, items = 3, 2
    with procs.sessionlog_server(tmp_path / "data", tmp_path / "s.log", workers=1) as server:
        took = asyncio.run(turn_writes.measure(server.address, turns, items))
        with Client(server.address) as client:
            written = [len(list(client.since(f"turn.{n}"))) for n in range(len(took))]
    assert sorted(took) == sorted(["one Append", "stream", "unary, in a row", "unary, at once"])
    assert all(len(times) == turns and min(times) > 0 for times in took.values()), took
    assert written == [(turn_writes.WARMUP_TURNS + turns) * items] * len(took)


def test_the_printout_names_every_way(capsys: pytest.CaptureFixture[str]) -> None:
    turn_writes.main(2, 1)
    out = capsys.readouterr().out
    assert out.startswith("2 turns of 1 items, ms per turn")
    for way in ("one Append", "stream", "unary, in a row", "unary, at once"):
        assert f"{way}: p50" in out
