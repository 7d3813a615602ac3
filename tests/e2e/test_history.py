"""One owner per data folder, history identity, and replicas that notice a different history.

Real `sessionlog serve` processes on 127.0.0.1, each on its own folder. A replica that is pointed
at another primary, or whose primary was restored from an older backup, must stop applying and
say DIVERGED (status, health, log) instead of mixing two data sets or claiming to be caught up;
`sessionlog replica resync` then rebuilds it from its primary.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._proc import SESSIONLOG, clean_env, free_port, run_cli
from tests.e2e._replication_cluster import (
    Cluster,
    Node,
    conversation_batch,
    session_ids,
    since_raw,
    wait_for,
    wait_position,
)

DIVERGED = rpb.REPLICATION_STATE_DIVERGED


def write(node: Node, session_id: str, turns: int = 3) -> None:
    """A few appends (each a change) on ``node``."""
    stub = node.stub()
    for turn in range(turns):
        events = conversation_batch(0, turn, 3)
        stub.Append(pb.AppendRequest(session_id=session_id, events=events), timeout=20)


def status(node: Node) -> rpb.GetReplicationStatusResponse:
    return node.status()


def wait_diverged(node: Node, timeout: float = 20.0) -> float:
    """Seconds until ``node`` reports DIVERGED (once its gRPC server answers at all)."""
    started = time.monotonic()
    wait_for(f"{node.name} answers", lambda: node.health() is not None, timeout)
    wait_for(f"{node.name} DIVERGED", lambda: status(node).state == DIVERGED, timeout)
    return time.monotonic() - started


# -- one owner per folder -------------------------------------------------------------------------


def test_second_server_on_a_folder_is_refused_naming_the_folder_and_pid(tmp_path: Path) -> None:
    """A second `serve` on a folder in use exits 1 with one line naming the folder and the
    holder's PID; the first keeps serving, and the folder is free again once it is killed."""
    with Cluster(tmp_path) as cluster:
        first = cluster.primary("shared")
        write(first, "s")
        second = subprocess.run(
            [str(SESSIONLOG), "serve", "--data", str(first.data), "--listen",
             f"127.0.0.1:{free_port()}"],
            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert second.returncode == 1, second
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert str(first.data.name) in lines[0], lines[0]
        assert f"PID {first.pid}" in lines[0], lines[0]
        assert "Traceback" not in second.stderr
        write(first, "s")  # the owner is unaffected
        assert len(since_raw(first.channel, "s")) > 0
        first.kill()  # the kernel drops the lock with the process, however it ends
        again = Node(tmp_path, "shared").start()
        cluster.nodes.append(again)
        assert "s" in session_ids(again.channel)


def test_admin_commands_that_write_refuse_a_folder_in_use(tmp_path: Path) -> None:
    """`admin restore` and `replica resync` refuse while a server owns the folder, and change
    nothing; `admin stats` (read-only) still works beside it."""
    with Cluster(tmp_path) as cluster:
        node = cluster.primary("busy")
        write(node, "kept")
        backup = tmp_path / "backup"
        assert (
            run_cli(["admin", "backup", str(backup), "--data", str(node.data)], tmp_path).returncode
            == 0
        )
        for args in (
            ["admin", "restore", str(backup), "--data", str(node.data), "--force"],
            ["replica", "resync", "--data", str(node.data)],
        ):
            refused = run_cli(args, tmp_path)
            assert refused.returncode == 1, refused
            assert f"PID {node.pid}" in refused.stderr, refused.stderr
        assert sorted(p.name for p in node.data.iterdir() if p.is_dir()) == []
        assert run_cli(["admin", "stats", "--data", str(node.data)], tmp_path).returncode == 0
        write(node, "kept")


# -- history identity -----------------------------------------------------------------------------


def test_restored_and_promoted_folders_start_a_new_history(tmp_path: Path) -> None:
    """A folder keeps its history id across restarts; a restore and a promotion each make a new
    one; a replica takes its primary's."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        write(primary, "a")
        first = status(primary).history_id
        assert len(first) == 16
        replica = cluster.replica(primary, "replica")
        wait_for("replica adopts", lambda: status(replica).history_id == first, 20)
        assert status(replica).primary_history_id == first

        primary.stop()
        primary.start()
        assert status(primary).history_id == first  # a restart is the same history

        backup = tmp_path / "backup"
        assert (
            run_cli(
                ["admin", "backup", str(backup), "--data", str(primary.data)], tmp_path
            ).returncode
            == 0
        )
        primary.stop()
        restored = run_cli(
            ["admin", "restore", str(backup), "--data", str(primary.data), "--force"], tmp_path
        )
        assert restored.returncode == 0, restored.stderr
        primary.start()
        after_restore = status(primary).history_id
        assert after_restore not in ("", first)
        assert any("restored" in e.get("message", "") for e in primary.log_entries())

        replica.stop()
        promoted = Node(tmp_path, "replica", port=replica.port)
        promoted.start()
        cluster.nodes.append(promoted)
        assert status(promoted).role == "primary"
        assert status(promoted).history_id not in (first, after_restore)
        assert any("primary" in e.get("message", "") for e in promoted.log_entries())


# -- divergence -----------------------------------------------------------------------------------


def test_replica_pointed_at_another_primary_diverges_and_resync_rebuilds_it(tmp_path: Path) -> None:
    """A replica restarted against a primary with other data reports DIVERGED (status, health,
    log), applies none of it, and after `replica resync` holds exactly the new primary's data."""
    with Cluster(tmp_path) as cluster:
        ours = cluster.primary("ours")
        theirs = cluster.primary("theirs")
        write(ours, "ours-1", 4)
        write(theirs, "theirs-1", 6)
        replica = cluster.replica(ours, "replica")
        wait_position(replica, status(ours).position)
        before = session_ids(replica.channel)
        position = status(replica).position

        http = free_port()  # taken while the replica still holds its own port
        replica.stop()
        moved = Node(
            tmp_path,
            "replica",
            port=replica.port,
            replica_of=theirs.address,
            args=["--http-listen", f"127.0.0.1:{http}", "--metrics-listen", f"127.0.0.1:{http}"],
        )
        cluster.nodes.append(moved)
        moved.start(wait=False)
        noticed = wait_diverged(moved)
        state = status(moved)
        assert not state.caught_up
        assert not state.connected
        assert "history" in state.detail
        assert state.position == position
        assert session_ids(moved.channel) == before
        assert moved.health() == health_pb2.HealthCheckResponse.NOT_SERVING
        assert any("diverged" in e.get("message", "") for e in moved.log_entries())
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/api/status", timeout=10) as reply:
            console = json.load(reply)["replication"]
        assert console["diverged"] is True
        assert console["caught_up"] is False
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10) as reply:
            assert "sessionlog_replication_diverged 1.0" in reply.read().decode()
        print(f"\ndivergence noticed {noticed:.2f} s after the replica started")

        moved.stop()
        resync = run_cli(["replica", "resync", "--data", str(moved.data)], tmp_path)
        assert resync.returncode == 0, resync.stderr
        assert any(p.name.startswith("diverged-") for p in moved.data.iterdir())
        moved.start()
        wait_position(moved, status(theirs).position)
        assert session_ids(moved.channel) == session_ids(theirs.channel) == ["theirs-1"]
        assert status(moved).history_id == status(theirs).history_id


def test_primary_restored_from_an_older_backup_is_noticed(tmp_path: Path) -> None:
    """A replica ahead of its primary's restored backup reports DIVERGED (not caught up, not lag
    0), while a replica seeded from that backup keeps following the restored primary."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        write(primary, "early", 3)
        backup = tmp_path / "backup"
        assert (
            run_cli(
                ["admin", "backup", str(backup), "--data", str(primary.data)], tmp_path
            ).returncode
            == 0
        )
        seeded = tmp_path / "seeded"
        seeded.mkdir()
        assert (
            run_cli(["admin", "restore", str(backup), "--data", str(seeded)], tmp_path).returncode
            == 0
        )
        write(primary, "late", 3)
        ahead = cluster.replica(primary, "ahead")
        wait_position(ahead, status(primary).position)

        primary.stop()
        assert (
            run_cli(
                ["admin", "restore", str(backup), "--data", str(primary.data), "--force"], tmp_path
            ).returncode
            == 0
        )
        primary.start()
        write(primary, "after-restore", 5)  # the restored primary runs past the replica's position
        wait_diverged(ahead)
        assert session_ids(ahead.channel) == [
            "early",
            "late",
        ]  # nothing of the new history mixed in

        behind = Node(tmp_path, "seeded", replica_of=primary.address)
        cluster.nodes.append(behind)
        behind.start()
        wait_position(behind, status(primary).position)
        assert status(behind).state == rpb.REPLICATION_STATE_STREAMING
        assert session_ids(behind.channel) == ["after-restore", "early"]


def test_zero_byte_or_missing_data_file_in_a_used_folder_is_refused(tmp_path: Path) -> None:
    """A folder that held data but whose data.mdb is now empty or gone refuses to start with one
    line naming the file, instead of serving an empty store."""
    with Cluster(tmp_path) as cluster:
        node = cluster.primary("used")
        write(node, "precious", 4)
        node.stop()
    data = node.data / "data.mdb"
    for damage in ("truncate", "remove"):
        if damage == "truncate":
            os.truncate(data, 0)
        else:
            data.unlink()
        result = run_cli(
            ["serve", "--data", str(node.data), "--listen", f"127.0.0.1:{free_port()}"],
            tmp_path,
            timeout=30,
        )
        assert result.returncode == 1, result
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "data.mdb" in lines[0], lines
        assert "backup" in lines[0], lines
        assert not data.exists() or data.stat().st_size == 0  # nothing was created in its place


@pytest.mark.parametrize("sig", [signal.SIGKILL])
def test_lock_survives_nothing_after_a_crash(tmp_path: Path, sig: int) -> None:
    """A killed server leaves no stale lock: the next one starts at once on the same folder."""
    with Cluster(tmp_path) as cluster:
        node = cluster.primary("crashy")
        write(node, "s")
        os.kill(node.pid, sig)
        assert node.process is not None
        assert node.process.process is not None
        node.process.process.wait(10)
        started = time.monotonic()
        node.start()
        assert time.monotonic() - started < 15
        assert "s" in session_ids(node.channel)


def test_deleting_the_pid_file_does_not_let_a_second_server_in(tmp_path: Path) -> None:
    """The lock is on the folder, not on sessionlog.lock: with that file deleted under a running
    server, a second server on the folder is still refused."""
    with Cluster(tmp_path) as cluster:
        first = cluster.primary("owned")
        (first.data / "sessionlog.lock").unlink()
        second = run_cli(
            ["serve", "--data", str(first.data), "--listen", f"127.0.0.1:{free_port()}"],
            tmp_path,
            timeout=30,
        )
        assert second.returncode == 1, second
        assert "in use by another sessionlog server" in second.stderr
        write(first, "s")


def test_a_file_copied_in_from_one_open_ago_is_recognised_as_restored(tmp_path: Path) -> None:
    """A cold copy of data.mdb taken one start ago and copied back by hand is not the folder's
    current file: the next start says so and begins a new history (acknowledged positions
    written since would otherwise vanish without a word)."""
    with Cluster(tmp_path) as cluster:
        node = cluster.primary("rolled")
        write(node, "s", 2)
        node.stop()
        cold = tmp_path / "cold.mdb"
        cold.write_bytes((node.data / "data.mdb").read_bytes())
        node.start()
        first = status(node).history_id
        write(node, "s", 3)
        node.stop()
        (node.data / "data.mdb").write_bytes(cold.read_bytes())
        node.start()
        assert status(node).history_id != first
        assert any("last held" in e.get("message", "") for e in node.log_entries())


def test_a_full_disk_at_start_is_one_line_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """A server started on a folder whose disk is full exits 1 with one line saying to free
    space, and leaves no half-written marker."""
    from tests._tmpfs import fill, small_tmpfs

    with small_tmpfs(tmp_path / "disk", 4 << 20) as disk:
        with Cluster(disk) as cluster:
            node = cluster.primary("full")
            write(node, "s")
            node.stop()
        filler = disk / "filler"
        with contextlib.suppress(OSError):
            fill(filler, 8 << 20)  # as much as fits
        result = run_cli(
            ["serve", "--data", str(node.data), "--listen", f"127.0.0.1:{free_port()}"],
            tmp_path,
            timeout=30,
        )
        filler.unlink()
        assert result.returncode == 1, result
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "free space" in lines[0]
        assert not list(node.data.glob("*.tmp"))


def test_resync_refuses_a_primary_folder_and_a_missing_one(tmp_path: Path) -> None:
    """`replica resync` on a folder last opened as a primary, or on no folder, exits 1 naming the
    problem and moves nothing; --force sets a primary's store aside on purpose."""
    with Cluster(tmp_path) as cluster:
        node = cluster.primary("a-primary")
        write(node, "kept")
        node.stop()
    refused = run_cli(["replica", "resync", "--data", str(node.data)], tmp_path)
    assert refused.returncode == 1, refused
    assert refused.stderr.startswith("sessionlog replica: ")
    assert "primary" in refused.stderr
    assert (node.data / "data.mdb").exists()
    missing = run_cli(["replica", "resync", "--data", str(tmp_path / "nowhere")], tmp_path)
    assert missing.returncode == 1, missing
    assert not (tmp_path / "nowhere").exists()
    forced = run_cli(["replica", "resync", "--data", str(node.data), "--force"], tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert not (node.data / "data.mdb").exists()


def test_a_damaged_record_on_the_primary_is_not_called_a_divergence(tmp_path: Path) -> None:
    """A primary whose stored event was changed after it was written sends a change that fails
    its checksum: the replica applies nothing past it and says the primary is damaged (resyncing
    the replica could not help), instead of DIVERGED."""
    from sessionlog.storage import schema
    from sessionlog.storage.store import Store
    from sessionlog.v1.event_pb2 import Event

    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        write(primary, "s", 3)
        primary.stop()
        store = Store(primary.data)
        try:
            meta = store.meta("s")
            assert meta is not None
            forged = Event.FromString(store.read_events(meta.sid, 4, 5)[0])
            forged.data["content"] = "changed after it was written"
            with store.env.begin(write=True) as txn:
                txn.put(
                    schema.event_key(meta.sid, 4),
                    forged.SerializeToString(),
                    db=store.tables.events,
                )
        finally:
            store.close()
        primary.start()
        replica = cluster.replica(primary, "replica", wait=False)
        wait_for("an answer", lambda: replica.health() is not None, 20)
        wait_for("the damage noticed", lambda: "damaged" in status(replica).detail, 20)
        state = status(replica)
        assert state.state != DIVERGED
        assert state.position == 0  # the batch holding the damaged change is refused whole
        assert "admin verify" in state.detail


def test_a_diverged_replica_reports_what_the_primary_holds_now(tmp_path: Path) -> None:
    """Refused by a primary restored to an older position, the replica's status shows that
    primary's head and history id, not the numbers it heard before; admin stats --server shows
    the state and why."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        write(primary, "s", 2)
        backup = tmp_path / "backup"
        assert (
            run_cli(
                ["admin", "backup", str(backup), "--data", str(primary.data)], tmp_path
            ).returncode
            == 0
        )
        write(primary, "s", 4)
        replica = cluster.replica(primary, "replica")
        wait_position(replica, status(primary).position)
        primary.stop()
        assert (
            run_cli(
                ["admin", "restore", str(backup), "--data", str(primary.data), "--force"], tmp_path
            ).returncode
            == 0
        )
        primary.start()
        wait_diverged(replica)
        state = status(replica)
        assert state.primary_position == status(primary).position == 2
        assert state.primary_history_id == status(primary).history_id
        stats = run_cli(
            ["admin", "stats", "--data", str(replica.data), "--server", replica.address, "--json"],
            tmp_path,
        )
        assert stats.returncode == 0, stats.stderr
        shown = json.loads(stats.stdout)["replication"]
        assert shown["state"] == "diverged"
        assert "history" in shown["detail"]


def test_admin_commands_on_a_folder_that_lost_its_data_name_it(tmp_path: Path) -> None:
    """`admin stats` and `admin verify` on a folder whose data.mdb was emptied say so in one line,
    as `serve` does."""
    with Cluster(tmp_path) as cluster:
        node = cluster.primary("emptied")
        write(node, "s")
        node.stop()
    os.truncate(node.data / "data.mdb", 0)
    for command in ("stats", "verify"):
        result = run_cli(["admin", command, "--data", str(node.data)], tmp_path)
        assert result.returncode == 1, result
        assert "has held a sessionlog store" in result.stderr, result.stderr
