"""The open handles of every named database (``schema.ALL_DBS``), opened once per environment.

A read-only environment of a store from before one of ``schema.OPTIONAL_DBS`` has no handle
for it (``None``, absent from ``by_name``): only the writer's paths use them, and those open
the store read-write, which creates them."""

from __future__ import annotations

from typing import Any

import lmdb

from sessionlog.storage import damage, schema


class Tables:
    """The open handles of every named database."""

    def __init__(self, env: lmdb.Environment) -> None:
        self.by_name: dict[str, Any] = {}
        with damage.reading("the directory of named tables"):
            for name in schema.ALL_DBS:
                try:
                    self.by_name[name.decode()] = env.open_db(name)
                except lmdb.ReadonlyError:
                    if name not in schema.OPTIONAL_DBS:
                        raise
                    # A read-only open of a store from before this table: it reads as empty.
        self.sessions = self.by_name["sessions"]
        self.ids = self.by_name["ids"]
        self.events = self.by_name["events"]
        self.requests = self.by_name["requests"]
        self.counters = self.by_name["counters"]
        self.leases = self.by_name["leases"]
        self.audit = self.by_name["audit"]
        self.changes = self.by_name["changes"]
        self.erasures = self.by_name.get("erasures")
        self.redactions = self.by_name.get("redactions")
        self.names: dict[int, str] = {id(db): name for name, db in self.by_name.items()}
