"""The open handles of every named database (``schema.ALL_DBS``), opened once per environment.

A read-only environment of a store from before one of ``schema.OPTIONAL_DBS`` has no handle
for it (``None``, in ``by_name`` too): its readers treat it as empty, and the writer's paths open
the store read-write, which creates it."""

from __future__ import annotations

from typing import Any

import lmdb

from sessionlog.storage import damage, schema


class Tables:
    """The open handles of every named database. On a read-only environment, a table of
    ``schema.OPTIONAL_DBS`` the store does not have yet is None (its readers treat it as empty)."""

    def __init__(self, env: lmdb.Environment) -> None:
        readonly = env.flags()["readonly"]
        with damage.reading("the directory of named tables"):
            self.by_name: dict[str, Any] = {}
            for name in schema.ALL_DBS:
                try:
                    self.by_name[name.decode()] = env.open_db(name)
                except lmdb.ReadonlyError:
                    if not (readonly and name in schema.OPTIONAL_DBS):
                        raise
                    self.by_name[name.decode()] = None
        self.sessions = self.by_name["sessions"]
        self.ids = self.by_name["ids"]
        self.events = self.by_name["events"]
        self.requests = self.by_name["requests"]
        self.counters = self.by_name["counters"]
        self.leases = self.by_name["leases"]
        self.audit = self.by_name["audit"]
        self.changes = self.by_name["changes"]
        self.records = self.by_name["records"]
        self.recent = self.by_name["recent"]
        self.labels = self.by_name["labels"]
        self.children = self.by_name["children"]
        self.usage = self.by_name["usage"]
        self.erasures = self.by_name["erasures"]
        self.redactions = self.by_name["redactions"]
        self.expiry = self.by_name["expiry"]
        self.purges = self.by_name["purges"]
        self.feed_index = self.by_name["feed_index"]
        self.names: dict[int, str] = {
            id(db): name for name, db in self.by_name.items() if db is not None
        }
