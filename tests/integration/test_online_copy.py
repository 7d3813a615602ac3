"""An online copy (`admin compact --online`, ``storage.compaction``) brought up to date and swapped
in at the next start, on a real folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sessionlog.storage import compaction
from sessionlog.storage.store import StoreConfig
from tests.integration.helpers import opened, user

PAD = "x" * 2_000

COPY = "import sys; from pathlib import Path; from sessionlog.storage import compaction; " + (
    "compaction.copy_online(Path(sys.argv[1]))"
)
"""The copy, in a process of its own as beside a running server (LMDB opens a folder once per
process)."""


def test_a_copy_catches_up_on_writes_that_grow_every_session_it_holds(tmp_path: Path) -> None:
    """A pending copy whose catch-up appends to every session it holds (one transaction that
    copies each leaf page it splits) is swapped in with every event: it is opened with the
    folder's map size (1 GiB here), not LMDB's 10 MiB default raised to the live file's size,
    where it failed MAP_FULL, and every later start of the folder with it."""
    path = tmp_path / "data"
    config = StoreConfig(map_size=1 << 30)
    with opened(path, config) as store:
        for n in range(100):
            store.append(f"s{n}", [user(f"{n}.{i} {PAD}") for i in range(20)])
        subprocess.run([sys.executable, "-c", COPY, str(path)], check=True, timeout=120)
        for n in range(100):
            store.append(f"s{n}", [user(f"{n}.{i} {PAD}") for i in range(20, 40)])
        written = {f"s{n}": store.read_session(f"s{n}", 0) for n in range(100)}
    swapped = compaction.swap_pending(path)
    assert swapped is not None
    assert swapped.records == 100
    assert not (path / compaction.PENDING).exists()
    with opened(path, config) as store:
        assert {f"s{n}": store.read_session(f"s{n}", 0) for n in range(100)} == written
    assert all(len(events) == 40 for events in written.values())
