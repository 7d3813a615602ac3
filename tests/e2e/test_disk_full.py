"""A full disk under a real server: appends fail RESOURCE_EXHAUSTED / STORAGE_FULL (cause disk),
reads keep working, writes resume by themselves once space is freed, and nothing a failed
append sent is ever stored (issue 12, item 5).

The data directory lives on a small tmpfs mounted for the test (the machine must allow
``mount``; it is skipped, with the reason, where it does not). A filler file takes most of the
tmpfs first, so the disk fills after a few hundred small appends; deleting it frees the space.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from sessionlog.storage import compaction
from sessionlog.testing import error_info
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests._tmpfs import fill, small_tmpfs
from tests.e2e._helpers import say
from tests.e2e._proc import ServerProcess, free_port, health_status, run_cli
from tests.e2e.test_metrics import scrape, value

TMPFS_BYTES = 8 << 20
FILLER_BYTES = 6 << 20
"""Leaves about 2 MiB for LMDB: full within a few seconds of appends."""
MAP_SIZE = "64MiB"
"""Larger than the tmpfs, so the disk fills before the map does."""
PAD = "x" * 4000
MAX_APPENDS = 2_000
FILL_SECONDS = 60.0
REFUSALS_AFTER_FULL = 5
TIMEOUT = 10.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs at tmp_path/disk, unmounted afterwards."""
    with small_tmpfs(tmp_path / "disk", TMPFS_BYTES) as mounted:
        yield mounted


def _serve(tmp_path: Path, disk: Path, address: str, metrics: str) -> ServerProcess:
    args = ["--data", str(disk / "data"), "--listen", address, "--map-size", MAP_SIZE]
    return ServerProcess([*args, "--metrics-listen", metrics, "--log-format", "json"], tmp_path)


def _append(stub: pb_grpc.SessionLogServiceStub, n: int) -> pb.AppendResponse:
    request = pb.AppendRequest(session_id="s", events=[say(f"r{n} {PAD}")], request_id=f"r{n}")
    reply: pb.AppendResponse = stub.Append(request, timeout=TIMEOUT)
    return reply


def _refused_for_disk(error: grpc.RpcError) -> None:
    """A full disk answers STORAGE_FULL with cause disk (an I/O error would be
    STORAGE_IO_ERROR); never INTERNAL or UNKNOWN."""
    info = error_info(error)
    assert (error.code(), info.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "STORAGE_FULL"), (
        error.code(),
        info,
    )
    assert info.metadata["cause"] == "disk", dict(info.metadata)
    assert "Free disk space" in error.details(), error.details()


def _fill_until_refused(stub: pb_grpc.SessionLogServiceStub) -> tuple[dict[str, int], int]:
    """Append until the disk refuses; return acknowledged request id -> seq, and the next n."""
    acknowledged: dict[str, int] = {}
    deadline = time.monotonic() + FILL_SECONDS
    for n in range(MAX_APPENDS):
        assert time.monotonic() < deadline, f"the disk did not fill within {FILL_SECONDS}s"
        try:
            reply = _append(stub, n)
        except grpc.RpcError as error:
            _refused_for_disk(error)
            return acknowledged, n
        acknowledged[f"r{n}"] = reply.events[0].seq
    pytest.fail(f"{MAX_APPENDS} appends never filled the disk")


def test_a_full_disk_refuses_appends_then_writes_resume_once_space_is_freed(
    tmp_path: Path, small_disk: Path
) -> None:
    """Fill the disk: STORAGE_FULL/disk, reads and health fine, metric and one log line; free
    space: appends resume with no restart; after a restart every acknowledged append is there
    once, densely, and no refused one is."""
    filler = small_disk / "filler"
    fill(filler, FILLER_BYTES)
    address, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    with _serve(tmp_path, small_disk, address, metrics) as server:
        server.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            acknowledged, n = _fill_until_refused(stub)
            assert len(acknowledged) >= 10, "the disk filled before any real work"
            refused = [f"r{n}"]
            for k in range(n + 1, n + 1 + REFUSALS_AFTER_FULL):  # still full: still refused
                with pytest.raises(grpc.RpcError) as caught:
                    _append(stub, k)
                _refused_for_disk(caught.value)
                refused.append(f"r{k}")

            assert server.process is not None
            assert server.process.poll() is None, "the server died on a full disk"
            assert health_status(address) == health_pb2.HealthCheckResponse.SERVING
            stored = [e for r in stub.Since(pb.SinceRequest(session_id="s")) for e in r.events]
            assert [e.seq for e in stored] == list(range(len(acknowledged)))

            def written_off() -> float:
                _, samples = scrape(f"http://{metrics}/metrics")
                return value(
                    samples,
                    "sessionlog_storage_write_errors_total",
                    reason="STORAGE_FULL",
                    cause="disk",
                )

            # A server of several workers publishes each worker's counts a moment after it
            # counts (and the scrape may be answered by another worker than the refusing one).
            deadline = time.monotonic() + 30.0
            while written_off() < len(refused) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert written_off() == len(refused)

            filler.unlink()
            for request_id in refused:  # the same request ids: nothing of them was stored
                reply = _append(stub, int(request_id[1:]))
                acknowledged[request_id] = reply.events[0].seq
        assert server.stop() == 0, server.log()
        log = server.log()
    assert len(re.findall(r'"storage writes failing', log)) == 1, log
    recovered = re.findall(r'"storage writes succeed again".*"refused": (\d+)', log)
    assert recovered == [str(len(refused))], log

    with _serve(tmp_path, small_disk, address, metrics) as server:
        server.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            stored = [e for r in stub.Since(pb.SinceRequest(session_id="s")) for e in r.events]
    assert [e.seq for e in stored] == list(range(len(acknowledged)))
    by_seq = {seq: request_id for request_id, seq in acknowledged.items()}
    assert len(by_seq) == len(acknowledged)
    assert [e.data["content"].split()[0] for e in stored] == [by_seq[e.seq] for e in stored]


def _copies(data: Path) -> list[str]:
    """The copies (whole or not) of `admin compact` in the folder."""
    made = (compaction.BUILDING, compaction.PARTIAL, compaction.PENDING)
    return sorted(path.name for path in data.iterdir() if path.name in made)


def test_a_copy_with_no_room_for_it_is_refused_and_leaves_nothing(
    tmp_path: Path, small_disk: Path
) -> None:
    """`admin compact --online` and the offline `admin compact` on a disk without room for the
    copy: each exits 1 saying so (the online copy used to die of SIGBUS), no half-written copy
    is left to take the space the server needs, and the server goes on taking writes."""
    address, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    data = small_disk / "data"
    with _serve(tmp_path, small_disk, address, metrics) as server:
        server.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            for n in range(150):
                _append(stub, n)
            free = shutil.disk_usage(small_disk).free
            (small_disk / "filler").write_bytes(b"\1" * (free - (100 << 10)))  # 100 KiB left
            copied = run_cli(["admin", "compact", "--online", "--data", str(data)], tmp_path)
            assert copied.returncode == 1, (copied.returncode, copied.stdout + copied.stderr)
            assert "no room" in copied.stderr, copied.stderr
            assert _copies(data) == []
            assert _append(stub, 150).events[0].seq == 150
        server.stop()
    offline = run_cli(["admin", "compact", "--data", str(data)], tmp_path)
    assert offline.returncode == 1, (offline.returncode, offline.stdout + offline.stderr)
    assert "no room" in offline.stderr, offline.stderr
    assert _copies(data) == []
