"""How full the store is: sessions, events, change-feed head and LMDB map usage, read in O(1).

Every number comes from LMDB's own bookkeeping (``stat`` entries of a database, ``info`` of the
environment), so reading them costs the same for ten sessions or ten million. Works on the
server's environment and on one opened read-only by `sessionlog admin` beside a running server.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import lmdb

from sessionlog.storage import changes, damage, integrity, schema
from sessionlog.storage.tables import Tables


@dataclass(frozen=True)
class Usage:
    sessions: int
    events: int
    """Events stored, over every session."""
    position: int
    """The newest change-feed position (0 for an empty store)."""
    head_commit_ns: int
    map_size: int
    """The most the data file may grow to (LMDB's map size), bytes."""
    used_bytes: int
    """The part of the map in use: pages up to the last one written. Freed pages inside it are
    reused by later writes, so this grows only when the free ones run out."""
    page_size: int
    readers: int
    """Reader slots in use (processes and threads holding read transactions)."""

    @property
    def used_fraction(self) -> float:
        return self.used_bytes / self.map_size if self.map_size else 0.0


def usage(env: lmdb.Environment, tables: Tables, txn: lmdb.Transaction | None = None) -> Usage:
    """The store's usage, read in ``txn`` (a backup's, say) or in a short read transaction."""
    if txn is None:
        with env.begin() as own:
            return usage(env, tables, own)
    sessions = txn.stat(tables.sessions)["entries"]
    events = txn.stat(tables.events)["entries"]
    position, commit_ns = changes.head(txn, tables)
    info = env.info()
    page_size = env.stat()["psize"]
    return Usage(
        sessions=sessions,
        events=events,
        position=position,
        head_commit_ns=commit_ns,
        map_size=info["map_size"],
        used_bytes=(info["last_pgno"] + 1) * page_size,
        page_size=page_size,
        readers=info["num_readers"],
    )


def open_readonly(path: str, lock: bool = True) -> tuple[lmdb.Environment, Tables]:
    """Open a store's environment read-only, beside a server that may be writing to it.

    ``path`` is a data folder, or a data file itself (a snapshot: open it with ``lock=False``).
    The map size is taken from the data file (``map_size=0``), so usage reports the size the
    server was started with. ``lock=False`` suits a copy no process is writing to (it creates
    no lock file). Raises lmdb.Error when ``path`` holds no sessionlog store, and
    integrity.DamagedStore (before mapping it) when its data file is truncated or not LMDB's,
    DataCorrupted when its directory of tables is damaged.
    """
    integrity.refuse_damaged(Path(path))
    env = lmdb.open(
        path,
        subdir=not Path(path).is_file(),
        readonly=True,
        create=False,
        map_size=0,
        max_dbs=len(schema.ALL_DBS),
        readahead=False,
        lock=lock,
    )
    try:
        with damage.reading(f"the directory of named tables in {path}"), env.begin() as txn:
            missing = [
                n for n in schema.ALL_DBS if txn.get(n) is None and n not in schema.OPTIONAL_DBS
            ]
        if missing and set(missing) <= set(schema.INDEX_DBS):
            raise lmdb.Error(
                f"{path}: written by an older sessionlog, without the session index tables; "
                "start this version's server on it once (it adds them), then read it"
            )
        if missing:
            names = ", ".join(n.decode() for n in missing)
            raise lmdb.Error(f"{path}: not a sessionlog store (no {names} table)")
        return env, Tables(env)
    except BaseException:
        env.close()
        raise
