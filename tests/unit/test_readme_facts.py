"""Numbers and claims in the READMEs and the docs that the code decides (issue 31: a newcomer
found three stale): each is read from the code, or the lock file, and looked for where a user
reads it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sessionlog.defaults import DEFAULT_MAX_EVENTS_PER_APPEND
from sessionlog.v1 import session_log_service_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
# README.md and every page of the documentation site, as one text.
README = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted(ROOT.glob("docs/**/*.md"))])
TS_README = (ROOT / "client" / "typescript" / "README.md").read_text()


def test_the_items_limit_is_the_servers_max_events_per_append() -> None:
    said = re.findall(r"More than ([\d,]+) items at once", README)
    assert said, "the framework guides say how many items one call may carry"
    for number in said:
        assert int(number.replace(",", "")) == DEFAULT_MAX_EVENTS_PER_APPEND, number


def test_tree_usage_is_not_called_unserved() -> None:
    assert "include_descendants" in pb.GetUsageRequest.DESCRIPTOR.fields_by_name
    assert "is not served yet" not in README
    assert "`GetUsage` with\n`include_descendants`" in README


def test_the_node_needed_by_the_agents_sdk_is_the_one_its_openai_needs() -> None:
    lock = json.loads((ROOT / "client" / "typescript" / "package-lock.json").read_text())
    engines = lock["packages"]["node_modules/openai"]["engines"]["node"]
    found = re.fullmatch(r">=(\d+)(?:\.\d+)*", engines)
    assert found, engines
    needed = f"Node {found.group(1)}"
    assert needed in TS_README.split("## OpenAI Agents SDK session")[1].split("\n## ")[0]
    assert f"{needed}+ for the OpenAI Agents SDK" in TS_README.splitlines()[0]
    assert f"{needed} for `sessionlog-client/openai-agents`" in README
