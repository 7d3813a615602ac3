"""bench.sendcost: each run streams every response to a real client and reads the loop's CPU."""

from __future__ import annotations

from bench.sendcost import MODES, measure


def test_each_mode_streams_its_responses_and_costs_loop_cpu() -> None:
    """Two short rounds: one figure per mode and round, each a positive CPU time per response
    (a handler that sent nothing, or a client that read nothing, would never finish)."""
    found = measure(responses=200, rounds=2)
    assert set(found) == set(MODES)
    for figures in found.values():
        assert len(figures) == 2
        assert all(figure > 0 for figure in figures)
