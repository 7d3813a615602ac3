"""The CLI's session records: create with --title/--label/--parent, `sessionlog label`,
`sessionlog update`, and `sessionlog sessions --filter --order-by`, run in this process through the
same ``main`` (``run_cli_here``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sessionlog.testing import RunningServer
from tests.e2e._proc import run_cli_here, running_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("cli-records") / "data") as running:
        yield running


def ok(server: RunningServer, *args: str) -> str:
    result = run_cli_here([*args, "--server", server.address])
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_create_label_update_and_list(server: RunningServer) -> None:
    """Labels set at create and by `label`, a status by `update`, then filtered listings."""
    ok(server, "create", "cli.a", "--title", "First try", "--label", "team=core")
    ok(server, "create", "cli.b", "--label", "team=web", "--owner", "ana")
    ok(server, "create", "cli.kid", "--parent", "cli.a")
    line = ok(server, "label", "cli.b", "env=prod", "team-").strip()
    assert line == "cli.b\t0 events\tenv=prod"
    shown = json.loads(ok(server, "update", "cli.a", "--status", "done", "--json"))
    assert (shown["status"], shown["title"], shown["labels"]) == (
        "done",
        "First try",
        {"team": "core"},
    )
    listed = ok(server, "sessions", "--prefix", "cli.", "--filter", 'labels.team = "core"')
    assert listed.splitlines() == ['cli.a\t0 events\t"First try"\tteam=core']
    newest = ok(server, "sessions", "--prefix", "cli.", "--order-by", "update_time desc")
    assert [row.split("\t")[0] for row in newest.splitlines()] == ["cli.a", "cli.b", "cli.kid"]
    children = ok(server, "sessions", "--filter", 'parent = "cli.a"')
    assert [row.split("\t")[0] for row in children.splitlines()] == ["cli.kid"]


def test_bad_input_is_refused(server: RunningServer) -> None:
    """A bad filter exits with the server's reason; a label without = is a usage error."""
    bad = run_cli_here(["sessions", "--filter", "nonsense", "--server", server.address])
    assert bad.returncode != 0
    assert "INVALID_FILTER" in bad.stderr
    usage = run_cli_here(["label", "cli.none", "novalue", "--server", server.address])
    assert usage.returncode == 2
    assert "KEY=VALUE" in usage.stderr
    missing = run_cli_here(["update", "cli.none", "--title", "x", "--server", server.address])
    assert missing.returncode != 0
    assert "SESSION_NOT_FOUND" in missing.stderr
