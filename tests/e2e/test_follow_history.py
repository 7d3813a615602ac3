"""FollowSessions resumes only on the history it read: each response carries the checksum of the
change at its position, and a resume that sends it back to a server whose change there is
another (a primary restored from an older backup and written since) is refused with
HISTORY_DIVERGED instead of carrying on in the middle of the new history; a restart of the same
server resumes with no gap and no duplicate.

Real `sessionlog serve` processes on 127.0.0.1, each on its own LMDB folder.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog_client import Client, Retry
from tests.e2e._helpers import check, failure, stdout_lines
from tests.e2e._proc import SESSIONLOG, clean_env, free_port, run_cli
from tests.e2e._replication_cluster import (
    Cluster,
    Node,
    changes_raw,
    conversation_batch,
    wait_position,
)

EVENTS_PER_APPEND = 3


def write(node: Node, session_id: str, appends: int) -> None:
    """``appends`` appends (each one change of ``EVENTS_PER_APPEND`` events) on ``node``."""
    stub = node.stub()
    for number in range(appends):
        events = conversation_batch(0, number, EVENTS_PER_APPEND)
        stub.Append(pb.AppendRequest(session_id=session_id, events=events), timeout=20)


def read_to_end(node: Node, **fields: object) -> tuple[list[pb.FollowedChange], int, bytes]:
    """The changes a FollowSessions stream sends until it is caught up, and the position and
    position_checksum of its caught-up response."""
    call = node.stub().FollowSessions(pb.FollowSessionsRequest(**fields), timeout=30)  # type: ignore[arg-type]
    changes: list[pb.FollowedChange] = []
    try:
        for response in call:
            changes.extend(response.changes)
            if response.caught_up:
                return changes, response.position, response.position_checksum
    finally:
        call.cancel()
    raise AssertionError("the stream ended before it was caught up")


def backup(node: Node, folder: Path) -> None:
    done = run_cli(["admin", "backup", str(folder), "--data", str(node.data)], node.root)
    assert done.returncode == 0, done.stderr


def restore(data: Path, folder: Path) -> None:
    """`admin restore --force` of ``folder`` over ``data`` (its server stopped)."""
    done = run_cli(["admin", "restore", str(folder), "--data", str(data), "--force"], data.parent)
    assert done.returncode == 0, done.stderr


def test_resume_after_a_restore_from_an_older_backup_is_refused(tmp_path: Path) -> None:
    """A position and checksum read before the primary was restored from an older backup and
    written past that position again: HISTORY_DIVERGED, not the new history from that position."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        write(primary, "early", 2)
        backup(primary, tmp_path / "backup")
        write(primary, "late", 6)
        seen, position, checksum = read_to_end(primary, from_start=True)
        assert [c.session_id for c in seen] == ["early"] * 2 + ["late"] * 6
        assert checksum
        assert position == seen[-1].position

        primary.stop()
        restore(primary.data, tmp_path / "backup")
        primary.start()
        write(primary, "after-restore", 12)  # the new history runs past the old position

        call = primary.stub().FollowSessions(
            pb.FollowSessionsRequest(after_position=position, after_checksum=checksum), timeout=30
        )
        error = failure(next, call)
        check(
            error,
            grpc.StatusCode.FAILED_PRECONDITION,
            "HISTORY_DIVERGED",
            after_position=position,
        )
        assert "from_start" in (error.details() or ""), error.details()
        # A client that sends no checksum resumes by position alone, as before.
        old, _, _ = read_to_end(primary, after_position=position)
        assert {c.session_id for c in old} == {"after-restore"}


def test_tail_prefix_stops_with_one_line_when_the_primary_was_restored(tmp_path: Path) -> None:
    """`sessionlog tail --prefix` that reconnects to a primary restored from an older backup and
    written since exits 1 with one HISTORY_DIVERGED line, printing nothing of the new history."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        write(primary, "t-early", 2)
        backup(primary, tmp_path / "backup")
        write(primary, "t-late", 6)
        with subprocess.Popen(
            [str(SESSIONLOG), "tail", "--prefix", "t-", "--server", primary.address],
            cwd=tmp_path,
            env=clean_env(workers=False),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as tail:
            try:
                lines, reader = stdout_lines(tail)
                shown = [lines.get(timeout=30) for _ in range(8 * EVENTS_PER_APPEND)]
                assert sum("t-late" in line for line in shown) == 6 * EVENTS_PER_APPEND, shown

                primary.stop()
                restore(primary.data, tmp_path / "backup")
                # Write the new history past the tail's position while the tail cannot reach
                # it (on another port), then bring the primary back where the tail reconnects.
                elsewhere = Node(tmp_path, primary.name, port=free_port()).start()
                write(elsewhere, "t-after", 12)
                elsewhere.stop()
                primary.start()

                assert tail.wait(timeout=60) == 1
            finally:
                if tail.poll() is None:
                    tail.kill()
            reader.join(timeout=10)
            assert tail.stderr is not None
            stderr = tail.stderr.read().strip().splitlines()
        assert len(stderr) == 1, stderr
        assert stderr[0].startswith("sessionlog: HISTORY_DIVERGED: "), stderr
        assert lines.empty(), "nothing of the new history is printed"


def test_resume_on_the_same_server_restarted_has_no_gap_or_duplicate(tmp_path: Path) -> None:
    """A restart is the same history: a raw resume with the checksum, and the Python client's own
    reconnect, both carry on with exactly the changes written since."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        write(primary, "one", 3)
        seen, position, checksum = read_to_end(primary, from_start=True)
        assert len(seen) == 3

        with Client(primary.address, retry=Retry(give_up_after=30.0, max_backoff=0.2)) as client:
            with client.follow_sessions(after=0) as stream:
                assert [next(stream).position for _ in range(3)] == [c.position for c in seen]
                assert (stream.position, stream.checksum) == (position, checksum)
                primary.stop()
                primary.start()
                write(primary, "two", 4)
                followed = [next(stream) for _ in range(4)]  # after its own reconnect
            assert stream.reconnects >= 1

        resumed, _, _ = read_to_end(primary, after_position=position, after_checksum=checksum)
        assert [c.position for c in resumed] == list(range(position + 1, position + 5))
        assert [c.session_id for c in resumed] == ["two"] * 4
        assert [c.position for c in followed] == [c.position for c in resumed]


@pytest.mark.parametrize("start", ["from_start", "end"])
def test_every_response_carries_the_checksum_at_its_position(tmp_path: Path, start: str) -> None:
    """The caught-up marker's checksum is the one a replica holds for that position, whether the
    stream started at the first position or at the feed's end (no change read yet)."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        write(primary, "c", 2)
        fields: dict[str, object] = {"from_start": True} if start == "from_start" else {}
        _, position, checksum = read_to_end(primary, **fields)
        assert position == primary.status().position
        stored = rpb.Change.FromString(changes_raw(primary.channel, position)[0])
        assert (stored.position, stored.checksum) == (position, checksum)


def test_a_heartbeat_past_changes_not_followed_carries_their_checksum(tmp_path: Path) -> None:
    """A heartbeat that advances an idle filtered stream past other sessions' changes names the
    checksum of the change at its position, so a resume from it is checked too."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        call = primary.stub().FollowSessions(
            pb.FollowSessionsRequest(prefix="h-", heartbeat_interval=Duration(nanos=200_000_000)),
            timeout=30,
        )
        try:
            assert next(call).caught_up
            write(primary, "other", 2)
            head = primary.status().position
            heartbeat = next(r for r in call if r.heartbeat and r.position == head)
        finally:
            call.cancel()
        stored = rpb.Change.FromString(changes_raw(primary.channel, head)[0])
        assert heartbeat.position_checksum == stored.checksum != b""
        resumed = primary.stub().FollowSessions(
            pb.FollowSessionsRequest(
                prefix="h-", after_position=head, after_checksum=heartbeat.position_checksum
            ),
            timeout=30,
        )
        try:
            assert next(resumed).caught_up
        finally:
            resumed.cancel()


def test_resume_on_a_promoted_replica_passes(tmp_path: Path) -> None:
    """A replica promoted after its primary stopped holds the same records: a position and
    checksum read on the primary resume on it with the changes written since."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        write(primary, "p", 3)
        replica = cluster.replica(primary, "replica")
        _, position, checksum = read_to_end(primary, from_start=True)
        wait_position(replica, position)
        primary.stop()
        replica.stop()
        promoted = Node(tmp_path, "replica", port=replica.port).start()
        cluster.nodes.append(promoted)
        write(promoted, "q", 2)
        resumed, _, _ = read_to_end(promoted, after_position=position, after_checksum=checksum)
        assert [(c.session_id, c.position) for c in resumed] == [
            ("q", position + 1),
            ("q", position + 2),
        ]
