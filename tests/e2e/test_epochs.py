"""Epochs, fencing, manual promotion and rejoin, with real server processes on 127.0.0.1.

A promotion (``sessionlog admin promote``) gives the new primary a higher epoch; a primary that
learns of it (a fence, a feed reader that knows it) refuses writes for good, also after a
restart; replicas refuse the feed of an older epoch; ``sessionlog replica rejoin`` turns the
deposed primary into a replica of the new one, discarding exactly the records only it had.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from sessionlog.testing import error_info
from sessionlog.v1 import admin_service_pb2 as apb
from sessionlog.v1 import admin_service_pb2_grpc as apb_grpc
from sessionlog.v1 import event_pb2
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._proc import run_cli
from tests.e2e._replication_cluster import (
    CALL_TIMEOUT,
    Cluster,
    Node,
    changes_raw,
    event,
    since_raw,
    wait_for,
    wait_position,
)

USER = event_pb2.EVENT_TYPE_USER_MESSAGE
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def append(node: Node, session_id: str, text: str, request_id: str = "") -> pb.AppendResponse:
    reply: pb.AppendResponse = node.stub().Append(
        pb.AppendRequest(session_id=session_id, events=[event(USER, text)], request_id=request_id),
        timeout=CALL_TIMEOUT,
    )
    return reply


def refusal(call: Any) -> tuple[grpc.StatusCode, str, dict[str, str], str]:
    """Run a call that must fail: its code, reason, ErrorInfo metadata and details."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    info = error_info(caught.value)
    return caught.value.code(), info.reason, dict(info.metadata), caught.value.details() or ""


def admin(node: Node) -> apb_grpc.AdminServiceStub:
    return apb_grpc.AdminServiceStub(node.channel)  # type: ignore[no-untyped-call]


def promote(tmp_path: Path, node: Node, *extra: str) -> dict[str, Any]:
    done = run_cli(["admin", "promote", "--server", node.address, "--json", *extra], tmp_path)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def history(node: Node) -> list[tuple[int, int]]:
    return [(e.epoch, e.first_position) for e in node.status().epoch_history]


def test_promote_while_writes_go_on_then_the_old_primary_refuses(tmp_path: Path) -> None:
    """A replica promoted while a writer appends to the primary takes epoch 2 and writes; the
    fenced old primary answers NOT_PRIMARY naming it, with the epoch, also after a restart."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        replica = cluster.replica(primary, "replica")
        acked: list[int] = []
        refused: list[dict[str, str]] = []
        stop = threading.Event()

        def write() -> None:
            deadline = time.monotonic() + 30
            n = 0
            while not stop.is_set() and time.monotonic() < deadline and n < 5000:
                try:
                    reply = append(primary, "busy", f"e{n}", request_id=f"r{n}")
                    acked.append(reply.events[0].seq)
                except grpc.RpcError as error:
                    refused.append(
                        {"reason": error_info(error).reason, **error_info(error).metadata}
                    )
                    return
                n += 1

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        wait_for("some writes", lambda: len(acked) >= 20, 20)
        promoted = promote(tmp_path, replica, "--fence", primary.address)
        writer.join(35)
        stop.set()
        assert not writer.is_alive()
        assert promoted["epoch"] == 2
        assert promoted["old_primary_stopped_writes"] is True
        assert refused, "the old primary never refused a write"
        assert refused[0]["reason"] == "NOT_PRIMARY", refused
        assert refused[0]["primary"] == replica.address
        assert refused[0]["epoch"] == "2"
        assert acked == list(range(len(acked)))  # dense, no gap, while it took writes
        status = replica.status()
        assert (status.role, status.state, status.epoch) == (
            "primary",
            rpb.REPLICATION_STATE_PRIMARY,
            2,
        )
        assert history(replica) == [(1, 1), (2, promoted["first_position"])]
        assert promoted["previous_primary"] == primary.address

        _reply, call = replica.stub().Append.with_call(
            pb.AppendRequest(session_id="busy", events=[event(USER, "on the new primary")]),
            timeout=CALL_TIMEOUT,
        )
        assert dict(call.trailing_metadata())["sessionlog-epoch"] == "2"
        new_change = changes_raw(replica.channel, promoted["first_position"])[0]
        assert rpb.Change.FromString(new_change).epoch == 2
        assert rpb.Change.FromString(changes_raw(replica.channel, 1)[0]).epoch == 1

        assert primary.status().state == rpb.REPLICATION_STATE_FENCED
        wait_for("the fenced primary NOT_SERVING", lambda: primary.health() == NOT_SERVING, 10)
        primary.stop()
        primary.start(wait=False)
        assert primary.health() == NOT_SERVING
        code, reason, metadata, details = refusal(lambda: append(primary, "busy", "late"))
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "NOT_PRIMARY")
        assert metadata == {"primary": replica.address, "epoch": "2"}
        assert "epoch 2" in details
        assert replica.address in details
        status = primary.status()
        assert (status.state, status.epoch, status.primary) == (
            rpb.REPLICATION_STATE_FENCED,
            2,
            replica.address,
        )


def test_a_primary_that_meets_a_higher_epoch_is_fenced_at_once(tmp_path: Path) -> None:
    """A change-feed reader naming a newer epoch stops the primary's writes at once and for good:
    the reader gets NOT_PRIMARY, every write after it too (with the epoch), also after a restart;
    reads go on."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        _reply, call = primary.stub().Append.with_call(
            pb.AppendRequest(session_id="s", events=[event(USER, "one")]), timeout=CALL_TIMEOUT
        )
        assert dict(call.trailing_metadata())["sessionlog-epoch"] == "1"
        stream = primary.feed().Changes(rpb.ChangesRequest(start_position=1, epoch=7), timeout=10)
        code, reason, metadata, _ = refusal(lambda: list(stream))
        assert (code, reason, metadata["epoch"]) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "NOT_PRIMARY",
            "7",
        )
        for attempt in range(2):
            with pytest.raises(grpc.RpcError) as caught:
                primary.stub().Append.with_call(
                    pb.AppendRequest(session_id="s", events=[event(USER, "two")]),
                    timeout=CALL_TIMEOUT,
                )
            info = error_info(caught.value)
            assert (info.reason, info.metadata["epoch"], info.metadata["primary"]) == (
                "NOT_PRIMARY",
                "7",
                "",
            )
            trailing = dict(caught.value.trailing_metadata() or ())
            assert trailing["sessionlog-epoch"] == "7"
            assert len(since_raw(primary.channel, "s")) == 1
            if attempt == 0:
                primary.stop()
                primary.start(wait=False)


def test_a_replica_refuses_the_feed_of_an_older_epoch(tmp_path: Path) -> None:
    """A replica that knows epoch 2 pointed at the fenced primary of epoch 1 (whose feed still
    holds the records it wrote before the fence, on the same history up to the replica's
    position, and which names no new primary) applies nothing of it, says so in its status and
    log, and keeps its data."""
    with Cluster(tmp_path) as cluster:
        old = cluster.primary("old")
        new = cluster.replica(old, "new")
        append(old, "s", "shared")
        shared = old.status().position
        wait_position(new, shared)
        promote(tmp_path, new)  # no fence: the old primary goes on taking writes
        follower = cluster.replica(new, "follower")
        wait_for("epoch 2 on the follower", lambda: follower.status().epoch == 2, 20)
        follower.stop()
        for n in range(3):
            append(old, "s", f"only on old {n}")
        run = run_cli(["admin", "fence", "--server", old.address, "--epoch", "2"], tmp_path)
        assert run.returncode == 0, run.stderr
        assert "stopped taking writes" in run.stdout
        follower.replica_of = old.address
        follower.start(wait=False)
        wait_for(
            "the refusal in the status",
            lambda: "older than epoch 2" in follower.status().detail,
            20,
        )
        time.sleep(0.5)
        status = follower.status()
        assert status.position == shared
        assert status.epoch == 2
        assert status.state == rpb.REPLICATION_STATE_DISCONNECTED
        assert any("deposed primary" in e.get("message", "") for e in follower.log_entries())
        assert len(since_raw(follower.channel, "s")) == 1
        assert len(since_raw(old.channel, "s")) == 4


def test_rejoin_discards_exactly_what_the_new_primary_never_got(tmp_path: Path) -> None:
    """The old primary wrote on after the promotion; rejoin discards those records and lists
    each one (positions, sessions, seqs, request ids) in its output, report and status, keeps
    the rest byte-identical to the new primary, and the folder then follows the new primary."""
    with Cluster(tmp_path) as cluster:
        old = cluster.primary("old")
        new = cluster.replica(old, "new")
        for n in range(5):
            append(old, "kept", f"k{n}", request_id=f"kept-{n}")
        shared = old.status().position
        wait_position(new, shared)
        promote(tmp_path, new)
        lost = [append(old, "kept", "lost-a", request_id="lost-1")]
        lost.append(append(old, "orphan", "lost-b", request_id="lost-2"))
        lost.append(append(old, "orphan", "lost-c"))
        for n in range(4):
            append(new, "kept", f"n{n}", request_id=f"new-{n}")
        old_head = old.status().position
        old.stop()

        done = run_cli(
            ["replica", "rejoin", "--primary", new.address, "--data", str(old.data), "--json"],
            tmp_path,
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["kept_through"] == shared
        discarded = result["discarded"]
        assert [d["position"] for d in discarded] == list(range(shared + 1, old_head + 1))
        assert [(d["session_id"], d["seqs"], d["request_ids"]) for d in discarded] == [
            ("kept", [5], ["lost-1"]),
            ("orphan", [0], ["lost-2"]),
            ("orphan", [1], []),
        ]
        assert {d["epoch"] for d in discarded} == {1}
        report = json.loads(Path(result["report"]).read_text())
        assert report["discarded"] == discarded
        assert report["primary"] == new.address
        assert Path(result["set_aside"], "data.mdb").is_file()  # the old store, kept

        old.replica_of = new.address
        old.start()
        wait_position(old, new.status().position)
        assert changes_raw(old.channel) == changes_raw(new.channel)
        for session_id in ("kept", "orphan"):
            assert since_raw(old.channel, session_id) == since_raw(new.channel, session_id)
        status = old.status()
        assert status.role == "replica"
        assert status.epoch == 2
        assert f"positions {shared + 1}..{old_head}" in status.detail
        assert Path(result["report"]).name in status.detail
        assert history(old) == history(new)
        append(new, "kept", "after the rejoin")
        wait_position(old, new.status().position)


def test_a_primary_of_two_workers_is_fenced_in_every_worker(tmp_path: Path) -> None:
    """A fence committed through one worker of `--workers 2` is seen by the other's writer in
    its own transaction: writes over many connections (spread over both workers) all fail."""
    with Cluster(tmp_path) as cluster:
        node = Node(tmp_path, "workers", args=["--workers", "2"])
        cluster.nodes.append(node)
        node.start()
        assert len(node.pids) == 3
        append(node, "s", "before")
        reply = admin(node).Fence(apb.FenceRequest(epoch=3, primary="127.0.0.1:1"), timeout=10)
        assert (reply.epoch, reply.stopped_writes) == (3, True)
        reasons = []
        for n in range(24):
            with grpc.insecure_channel(node.address) as channel:
                client = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                with pytest.raises(grpc.RpcError) as caught:
                    client.Append(
                        pb.AppendRequest(session_id="s", events=[event(USER, f"x{n}")]),
                        timeout=CALL_TIMEOUT,
                    )
                info = error_info(caught.value)
                reasons.append((info.reason, info.metadata["primary"], info.metadata["epoch"]))
        assert set(reasons) == {("NOT_PRIMARY", "127.0.0.1:1", "3")}
        assert len(since_raw(node.channel, "s")) == 1


def test_bad_input_to_promote_and_fence_gets_clear_errors(tmp_path: Path) -> None:
    """Fence without an epoch, with a bad address or a stale epoch, promote of a primary or to
    a stale epoch, an undecodable request, and rejoin against a replica or beside a running
    server: each refused with its own reason, nothing changed."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        replica = cluster.replica(primary, "replica")
        append(primary, "s", "one")
        cases = {
            "no epoch": (lambda: admin(primary).Fence(apb.FenceRequest(), timeout=10)),
            "bad address": (
                lambda: admin(primary).Fence(apb.FenceRequest(epoch=5, primary="x"), timeout=10)
            ),
            "stale fence": (lambda: admin(primary).Fence(apb.FenceRequest(epoch=1), timeout=10)),
            "promote a primary": (lambda: admin(primary).Promote(apb.PromoteRequest(), timeout=10)),
            "stale promote": (
                lambda: admin(replica).Promote(apb.PromoteRequest(epoch=1), timeout=10)
            ),
            "undecodable": (
                lambda: primary.channel.unary_unary("/sessionlog.v1.AdminService/Fence")(
                    b"\xff\xff", timeout=10
                )
            ),
        }
        got = {name: refusal(call)[:2] for name, call in cases.items()}
        invalid, failed = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
        assert got == {
            "no epoch": (invalid, "INVALID_EPOCH"),
            "bad address": (invalid, "INVALID_ADDRESS"),
            "stale fence": (failed, "STALE_EPOCH"),
            "promote a primary": (failed, "ALREADY_PRIMARY"),
            "stale promote": (failed, "STALE_EPOCH"),
            "undecodable": (invalid, "MALFORMED_REQUEST"),
        }
        assert primary.status().state == rpb.REPLICATION_STATE_PRIMARY
        assert replica.status().role == "replica"
        append(primary, "s", "still a primary")

        busy = run_cli(
            ["replica", "rejoin", "--primary", replica.address, "--data", str(primary.data)],
            tmp_path,
        )
        assert busy.returncode == 1
        assert "stop the server first" in busy.stderr
        primary.stop()
        not_primary = run_cli(
            ["replica", "rejoin", "--primary", replica.address, "--data", str(primary.data)],
            tmp_path,
        )
        assert not_primary.returncode == 1
        assert "does not take writes" in not_primary.stderr, not_primary.stderr


# -- a deposed primary's replicas ------------------------------------------------------------------


def deposed_log(node: Node) -> list[dict[str, Any]]:
    return [
        entry
        for entry in node.log_entries()
        if entry.get("message", "").startswith("replica's primary was deposed")
    ]


def test_replicas_of_a_fenced_primary_turn_to_the_new_one_or_say_rejoin(tmp_path: Path) -> None:
    """After `promote --fence`-style fencing, the old primary's feed names the new primary: a
    replica on the shared history (stopped while the old primary wrote on alone, started again
    against it) turns to the new primary by itself and follows it (log line, status, NOT_PRIMARY
    hint); one that applied the old primary's writes past the promotion is refused there and
    stops DIVERGED, naming `replica rejoin --primary NEW`, which then mends it."""
    fast = ["--replica-timeout", "1"]
    with Cluster(tmp_path) as cluster:
        old = cluster.primary("old")
        new = cluster.replica(old, "new")
        shared = cluster.replica(old, "shared", args=fast)
        ahead = cluster.replica(old, "ahead", args=fast)
        for n in range(3):
            append(old, "s", f"both {n}", request_id=f"both-{n}")
        head = old.status().position
        for node in (new, shared, ahead):
            wait_position(node, head)
        shared.stop()
        promote(tmp_path, new)  # not fenced yet: the old primary writes on, `ahead` follows it
        for n in range(2):
            append(old, "s", f"only old {n}")
        wait_position(ahead, old.status().position)
        fence = ["admin", "fence", "--server", old.address, "--epoch", "2"]
        done = run_cli([*fence, "--primary", new.address], tmp_path)
        assert done.returncode == 0, done.stderr
        shared.start(wait=False)  # its primary is the fenced one, still on its command line
        append(new, "s", "on the new primary", request_id="new-0")

        wait_for(
            "shared follows the new primary", lambda: shared.status().primary == new.address, 20
        )
        wait_position(shared, new.status().position)
        status = shared.status()
        assert (status.state, status.epoch) == (rpb.REPLICATION_STATE_STREAMING, 2)
        assert changes_raw(shared.channel) == changes_raw(new.channel)
        [line] = deposed_log(shared)
        assert (line["old_primary"], line["primary"], line["epoch"]) == (
            old.address,
            new.address,
            2,
        )
        _, reason, metadata, _ = refusal(lambda: append(shared, "s", "to a replica"))
        assert (reason, metadata["primary"]) == ("NOT_PRIMARY", new.address)

        wait_for(
            "ahead is refused by the new primary",
            lambda: ahead.status().state == rpb.REPLICATION_STATE_DIVERGED,
            20,
        )
        status = ahead.status()
        assert status.primary == new.address
        assert f"sessionlog replica rejoin --primary {new.address}" in status.detail
        assert status.position == head + 2  # applied nothing of the new feed
        assert len(deposed_log(ahead)) == 1

        ahead.stop()
        done = run_cli(
            ["replica", "rejoin", "--primary", new.address, "--data", str(ahead.data), "--json"],
            tmp_path,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["kept_through"] == head
        ahead.replica_of = new.address
        ahead.start()
        wait_position(ahead, new.status().position)
        assert changes_raw(ahead.channel) == changes_raw(new.channel)


def test_a_replica_restarted_with_its_stale_replica_of_follows_the_primary_it_turned_to(
    tmp_path: Path,
) -> None:
    """A replica that turned from its --replica-of (deposed) to the new primary by itself is
    restarted with the same command line after the old primary is gone for good: it follows
    the new primary (status, NOT_PRIMARY hint, new writes applied), and its log says to change
    --replica-of."""
    with Cluster(tmp_path) as cluster:
        old = cluster.primary("old")
        new = cluster.replica(old, "new")
        turned = cluster.replica(old, "turned", args=["--replica-timeout", "1"])
        append(old, "s", "both", request_id="both-0")
        for node in (new, turned):
            wait_position(node, old.status().position)
        promote(tmp_path, new)
        fence = ["admin", "fence", "--server", old.address, "--epoch", "2"]
        done = run_cli([*fence, "--primary", new.address], tmp_path)
        assert done.returncode == 0, done.stderr
        wait_for("turned follows new", lambda: turned.status().primary == new.address, 20)
        old.kill()
        turned.stop()
        assert turned.replica_of == old.address  # the command line still names the old one
        turned.start()
        append(new, "s", "after the restart", request_id="new-1")
        wait_position(turned, new.status().position, timeout=20)
        status = turned.status()
        assert status.primary == new.address
        assert status.state == rpb.REPLICATION_STATE_STREAMING
        _, reason, metadata, _ = refusal(lambda: append(turned, "s", "to a replica"))
        assert (reason, metadata["primary"]) == ("NOT_PRIMARY", new.address)
        said = [e for e in turned.log_entries() if "change --replica-of" in e.get("message", "")]
        assert said, turned.log()


def test_a_replica_told_of_no_new_primary_applies_nothing_more(tmp_path: Path) -> None:
    """A primary fenced without a new primary's address (a reader's newer epoch) says so on its
    feed: its replica records the newer epoch, applies nothing more from it and says why."""
    with Cluster(tmp_path) as cluster:
        old = cluster.primary("old")
        replica = cluster.replica(old, "replica", args=["--replica-timeout", "1"])
        append(old, "s", "one")
        wait_position(replica, old.status().position)
        done = run_cli(["admin", "fence", "--server", old.address, "--epoch", "4"], tmp_path)
        assert done.returncode == 0, done.stderr
        wait_for("the replica knows epoch 4", lambda: replica.status().epoch == 4, 20)
        wait_for(
            "the replica says its primary was deposed",
            lambda: "names no new primary" in replica.status().detail,
            20,
        )
        status = replica.status()
        assert (status.primary, status.position) == (old.address, old.status().position)
        assert status.state == rpb.REPLICATION_STATE_DISCONNECTED


# -- epochs in progress reports and from clients ---------------------------------------------------


def report_progress(node: Node, *reports: rpb.ReportProgressRequest) -> grpc.RpcError | None:
    """Send ``reports`` on one ReportProgress stream; the error it ended with, if any."""
    call = node.channel.stream_unary(
        "/sessionlog.v1.ReplicationService/ReportProgress",
        request_serializer=rpb.ReportProgressRequest.SerializeToString,
        response_deserializer=rpb.ReportProgressResponse.FromString,
    )
    try:
        call(iter(reports), timeout=CALL_TIMEOUT)
    except grpc.RpcError as error:
        return error
    return None


def test_a_progress_report_naming_a_newer_epoch_fences_the_primary(tmp_path: Path) -> None:
    """A replica's progress report that names an epoch above the primary's deposes it, as a
    change-feed reader's does: the stream ends NOT_PRIMARY, writes are refused from then on."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        append(primary, "s", "one")
        assert report_progress(primary, rpb.ReportProgressRequest(replica="r", epoch=1)) is None
        error = report_progress(primary, rpb.ReportProgressRequest(replica="r", epoch=3))
        assert error is not None
        info = error_info(error)
        assert (error.code(), info.reason, info.metadata["epoch"]) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "NOT_PRIMARY",
            "3",
        )
        status = primary.status()
        assert (status.state, status.epoch) == (rpb.REPLICATION_STATE_FENCED, 3)
        _, reason, metadata, _ = refusal(lambda: append(primary, "s", "two"))
        assert (reason, metadata["epoch"]) == ("NOT_PRIMARY", "3")
        assert any(
            e.get("message", "").startswith("a replica's progress report knows a newer epoch")
            for e in primary.log_entries()
        )


def test_a_write_from_a_caller_that_saw_a_newer_epoch_is_refused(tmp_path: Path) -> None:
    """A write whose `sessionlog-epoch` request metadata is above the server's epoch is refused
    NOT_PRIMARY (no primary named, the server's epoch) and writes nothing; it does not fence the
    server. One at its epoch writes; a malformed value is MALFORMED_REQUEST."""
    with Cluster(tmp_path) as cluster:
        primary = cluster.primary()
        stub = primary.stub()

        def send(epoch: str, text: str) -> Any:
            request = pb.AppendRequest(session_id="s", events=[event(USER, text)])
            return stub.Append.with_call(
                request, metadata=(("sessionlog-epoch", epoch),), timeout=CALL_TIMEOUT
            )

        send("0", "first")  # a fresh store: epoch 1 from this write on
        _, call = send("1", "at its epoch")
        assert dict(call.trailing_metadata())["sessionlog-epoch"] == "1"
        code, reason, metadata, details = refusal(lambda: send("2", "from a newer epoch"))
        assert (code, reason, metadata) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "NOT_PRIMARY",
            {"primary": "", "epoch": "1"},
        )
        assert "seen epoch 2" in details
        code, reason, _, _ = refusal(lambda: send("two", "malformed"))
        assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST")
        assert len(since_raw(primary.channel, "s")) == 2
        assert primary.status().state == rpb.REPLICATION_STATE_PRIMARY
