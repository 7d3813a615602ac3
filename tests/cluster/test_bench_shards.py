"""The bench's case 10 (``bench.shards``), run tiny: 16 h2load clients straight to a static
group's primary, through a real HAProxy to that group, and through HAProxy to both groups; real
servers, HAProxy and h2load processes on 127.0.0.1, as ``python -m bench --only shards`` starts
them.

Needs Debian's haproxy and nghttp2-client (`make test` installs both).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench import shards
from bench.common import Settings
from bench.report import shards_paper, shards_table
from sessionlog.shard.shardmap import ShardMap

pytestmark = pytest.mark.serial
"""Serial (tests/conftest.py): it measures through h2load with sub-second runs, as
tests/e2e/test_bench.py does."""

SETTINGS = replace(Settings.quick(), duration=0.6, workers_duration=0.6, warmup=0.5)
"""Short, but long enough for every h2load client to finish calls on a busy machine (a warm-up
or a run in which a client got no reply at all is an error)."""


def test_sessions_are_spread_over_the_groups_by_slot() -> None:
    shard_map = ShardMap.even_split({"g1": ["127.0.0.1:1"], "g2": ["127.0.0.1:2"]})
    sessions = shards.spread_sessions(shard_map, 16)
    assert len(set(sessions)) == 16
    owners = [shard_map.owner(session).name for session in sessions]
    assert owners == ["g1", "g2"] * 8
    only_g2 = shards.spread_sessions(shard_map, 16, ["g2"])
    assert {shard_map.owner(session).name for session in only_g2} == {"g2"}
    assert len(set(only_g2)) == 16


def test_the_shards_group_measures_direct_one_and_two_groups_with_haproxys_cpu(
    tmp_path: Path,
) -> None:
    missing = shards.unavailable()
    if missing:
        pytest.fail(missing)
    rows = shards.run_group(SETTINGS, tmp_path, lambda message: None)

    assert [row.kind for row in rows] == [shards.DIRECT, shards.VIA_ONE]
    direct, via_one, via_two = rows[0].ceiling, rows[0].sessionlog, rows[1].sessionlog
    assert rows[1].ceiling is via_one
    for measurement in (direct, via_one, via_two):
        assert measurement.errors == 0, measurement.first_error
        assert measurement.calls > 0
        assert measurement.details["stored_events_per_client"] == [
            pytest.approx(n, abs=1) for n in measurement.details["succeeded_per_client"]
        ]
    assert direct.details["via"] == "direct"
    assert "haproxy_us_per_call" not in direct.details
    assert direct.details["sessions_per_group"] == {"g1": 16, "g2": 0}
    assert via_one.details["sessions_per_group"] == {"g1": 16, "g2": 0}
    assert via_two.details["sessions_per_group"] == {"g1": 8, "g2": 8}
    for proxied in (via_one, via_two):
        assert proxied.details["via"] == "haproxy"
        assert proxied.details["haproxy_cpu_seconds"] > 0
        assert proxied.details["haproxy_us_per_call"] > 0
    assert rows[0].ratio is not None
    assert rows[1].ratio is not None

    text = shards_table(rows)
    assert "via haproxy, 2 groups" in text
    assert "direct to the primary, 1 group" in text
    paper = "\n".join(shards_paper(rows))
    assert "one HAProxy core forwards at most" in paper
    assert "groups per HAProxy core" in paper
