"""The open handles of every named database (``schema.ALL_DBS``), opened once per environment."""

from __future__ import annotations

from typing import Any

import lmdb

from sessionlog.storage import damage, schema


class Tables:
    """The open handles of every named database."""

    def __init__(self, env: lmdb.Environment) -> None:
        with damage.reading("the directory of named tables"):
            self.by_name: dict[str, Any] = {
                name.decode(): env.open_db(name) for name in schema.ALL_DBS
            }
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
        self.names: dict[int, str] = {id(db): name for name, db in self.by_name.items()}
