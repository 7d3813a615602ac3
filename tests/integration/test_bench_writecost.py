"""bench.writecost: its runs count real commits, and its split recovers a known cost line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.writecost import WriteCost, measure, split


def test_a_run_counts_appends_commits_and_each_threads_cpu(tmp_path: Path) -> None:
    """Four tasks for a fraction of a second: appends made, fewer commits than appends (they
    group), and CPU seen on both threads."""
    run = measure(4, 0.3, "nosync", str(tmp_path))
    assert run.appends > 0
    assert 0 < run.commits <= run.appends
    assert run.per_commit >= 1.0
    assert run.writer_us > 0
    assert run.loop_us > 0


def test_a_run_of_many_events_per_append_writes_them_all(tmp_path: Path) -> None:
    """``events``: each append carries that many events, and the run still counts appends and
    the commits that wrote them (case 3's appends, in process)."""
    one = measure(2, 0.3, "nosync", str(tmp_path))
    many = measure(2, 0.3, "nosync", str(tmp_path), events=100)
    assert 0 < many.commits <= many.appends
    assert many.writer_us > one.writer_us  # a hundred events' puts cost the writer more


def test_split_recovers_the_fixed_and_per_append_costs() -> None:
    """Runs made from 90 µs per group and 45 µs per append give those two figures back."""

    def run(per_commit: int) -> WriteCost:
        appends = 1_600
        return WriteCost(
            tasks=per_commit,
            appends=appends,
            commits=appends // per_commit,
            seconds=1.0,
            writer_us=90 / per_commit + 45,
            loop_us=0.0,
        )

    fixed, each = split(run(1), run(16))
    assert fixed == pytest.approx(90)
    assert each == pytest.approx(45)
    with pytest.raises(ValueError, match="same appends per commit"):
        split(run(4), run(4))
