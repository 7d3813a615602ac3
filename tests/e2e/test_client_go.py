"""The Go stubs (client/go) from the project's test command, built offline from Debian's packages.

`make go-tools` installs golang-go, golang-google-grpc-dev, golang-google-protobuf-dev and
golang-github-golang-protobuf-1-5-dev (with Debian's default 1-3 the stubs panic in
table_marshal.go). The build is GOPATH mode (GO111MODULE=off) over a copy of client/go in a temp
tree plus /usr/share/gocode, with GOPROXY=off: nothing is downloaded. The example binary is built
once per session; the Go error tests run through `go test` against a real server.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.appendload import DEBIAN_GOPATH, go_env
from sessionlog.testing import RunningServer
from tests.e2e._replication_cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
MODULE = "github.com/sessionlog/sessionlog/client/go"
BUILD_SECONDS = 240
HINT = "run `make go-tools` as root (Debian's golang-go and the golang-google-*-dev packages)"


@dataclass(frozen=True)
class GoTree:
    """A GOPATH holding a copy of client/go, the environment to build there, and the example."""

    package: Path
    env: dict[str, str]
    example: Path


def run_go(tree_env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    go = shutil.which("go")
    assert go, f"go is not on PATH; {HINT}"
    return subprocess.run(
        [go, *args],
        cwd=cwd,
        env={**tree_env, "PWD": str(cwd)},
        capture_output=True,
        text=True,
        timeout=BUILD_SECONDS,
        check=False,
    )


@pytest.fixture(scope="session")
def go_tree(tmp_path_factory: pytest.TempPathFactory) -> GoTree:
    """client/go copied into $GOPATH/src/<module> and the example built there (once)."""
    assert (DEBIAN_GOPATH / "src" / "google.golang.org" / "grpc").is_dir(), HINT
    gopath = tmp_path_factory.mktemp("gopath")
    package = gopath / "src" / MODULE
    shutil.copytree(ROOT / "client" / "go", package)
    env = go_env(gopath)
    example = gopath / "bin" / "example"
    built = run_go(env, package, "build", "-o", str(example), "./example")
    assert built.returncode == 0, f"go build failed ({HINT}):\n{built.stderr}"
    return GoTree(package=package, env=env, example=example)


@pytest.mark.timeout(BUILD_SECONDS + 60)
def test_go_example_prints_the_transcript(go_tree: GoTree, server: RunningServer) -> None:
    """client/go/example appends two messages and prints the derived ones, role and content."""
    result = subprocess.run(
        [str(go_tree.example), server.address],
        env=go_tree.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, (
        "the Go example failed (a panic in table_marshal.go means Debian's "
        f"golang-github-golang-protobuf-1-3-dev: {HINT}):\n{result.stderr}"
    )
    assert result.stdout.splitlines() == [
        "ROLE_USER What is LMDB?",
        "ROLE_ASSISTANT A memory-mapped B+tree store.",
    ]


@pytest.mark.timeout(BUILD_SECONDS + 60)
def test_go_errors_carry_error_info(go_tree: GoTree, server: RunningServer) -> None:
    """`go test` in client/go/example: SEQ_CONFLICT (next_seq) and INVALID_SESSION_ID ErrorInfo;
    state deltas, GetState and a hide; ListLeaseAudit after a takeover."""
    env = {**go_tree.env, "SESSIONLOG_TEST_ADDRESS": server.address}
    names = (
        "TestSeqConflictReportsNextSeq",
        "TestInvalidSessionIdIsRefused",
        "TestStateAndHide",
        "TestLeaseAuditListsTakeovers",
    )
    only = "-run=" + "|".join(names)
    result = run_go(env, go_tree.package, "test", "-v", "-count=1", only, "./example")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for name in names:
        assert f"--- PASS: {name}" in output, output
    assert "SKIP" not in output, output


@pytest.mark.timeout(BUILD_SECONDS + 60)
def test_go_epochs_are_sent_learnt_and_judged(go_tree: GoTree, server: RunningServer) -> None:
    """`go test` of client/go/epoch against a real server: a write's reply teaches the tracker
    the epoch; past it (a newer one learnt) the server refuses NOT_PRIMARY naming its own and
    stores nothing; an ack arriving once a newer epoch is known is LeadershipLost, committed."""
    env = {**go_tree.env, "SESSIONLOG_TEST_ADDRESS": server.address}
    result = run_go(env, go_tree.package, "test", "-v", "-count=1", "./epoch")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for name in ("TestWritesLearnAndSendTheEpoch", "TestAnAckBelowTheEpochSeenIsLeadershipLost"):
        assert f"--- PASS: {name}" in output, output
    assert "SKIP" not in output, output


@pytest.mark.timeout(BUILD_SECONDS + 60)
def test_go_sessionheader_names_the_session_of_every_call(go_tree: GoTree) -> None:
    """`go test` of client/go/sessionheader: a real gRPC server in the test records that every
    SessionLogService call naming a session (a fork's source) arrives with x-session-id (UTF-8
    beyond ASCII percent-encoded), ListSessions without it, and the caller's token kept."""
    result = run_go(go_tree.env, go_tree.package, "test", "-v", "-count=1", "./sessionheader")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for name in ("TestEveryCallNamingASessionCarriesTheHeader", "TestAHeaderTheCallerSetIsKept"):
        assert f"--- PASS: {name}" in output, output


@pytest.mark.timeout(BUILD_SECONDS + 90)
def test_go_typed_errors_from_a_sync_primary_and_a_replica(go_tree: GoTree, tmp_path: Path) -> None:
    """`go test` of client/go/sessionlogerr, then against real servers: a primary with --ack
    replica and no replica answers REPLICAS_UNAVAILABLE as a *ReplicasUnavailableError (needed 1,
    counted 0, its position; a retry with the request id writes nothing more), and a replica's
    NOT_PRIMARY is a *NotPrimaryError naming its primary."""
    with Cluster(tmp_path) as cluster:
        lonely = cluster.primary("lonely", args=["--ack", "replica", "--sync-timeout", "0.3"])
        primary = cluster.primary("primary")
        replica = cluster.replica(primary, "replica")
        env = {
            **go_tree.env,
            "SESSIONLOG_TEST_SYNC_ADDRESS": lonely.address,
            "SESSIONLOG_TEST_REPLICA_ADDRESS": replica.address,
            "SESSIONLOG_TEST_PRIMARY_ADDRESS": primary.address,
        }
        only = "-run=TestReplicasUnavailable|TestNotPrimary|TestOtherErrors"
        result = run_go(
            env, go_tree.package, "test", "-v", "-count=1", only, "./sessionlogerr", "./example"
        )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for name in (
        "TestReplicasUnavailableCarriesItsCounts",
        "TestNotPrimaryAndLeadershipLostAreTyped",
        "TestOtherErrorsPassThroughOrStayGeneric",
        "TestReplicasUnavailableIsTyped",
        "TestNotPrimaryIsTyped",
    ):
        assert f"--- PASS: {name}" in output, output
    assert "SKIP" not in output, output
