"""A full LMDB map: STORAGE_FULL, reads keep working, and a restart with a larger --map-size
lets writes continue at the next seq (issue 6, resource exhaustion)."""

from __future__ import annotations

from pathlib import Path

import grpc

from sessionlog.testing import error_info
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._helpers import say
from tests.e2e._proc import ServerProcess, free_port


def serve(tmp_path: Path, address: str, map_size: str) -> ServerProcess:
    return ServerProcess(
        ["--data", str(tmp_path / "data"), "--listen", address, "--map-size", map_size], tmp_path
    )


def test_full_map_then_restart_with_a_larger_one(tmp_path: Path) -> None:
    """Fill a 1 MiB map, read it back, restart with 16 MiB, append the next dense seq."""
    address = f"127.0.0.1:{free_port()}"
    acknowledged = 0
    with serve(tmp_path, address, "1MiB") as server:
        server.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            request = pb.AppendRequest(session_id="s", events=[say("x" * 2000)])
            refusal: grpc.RpcError | None = None
            for _ in range(2_000):  # bounded: 1 MiB holds a few hundred of these
                try:
                    acknowledged = stub.Append(request, timeout=10).next_seq
                except grpc.RpcError as error:
                    refusal = error
                    break
            assert refusal is not None, "the map never filled"
            assert refusal.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert error_info(refusal).reason == "STORAGE_FULL"
            assert acknowledged > 0
            events = [e for r in stub.Since(pb.SinceRequest(session_id="s")) for e in r.events]
            assert [e.seq for e in events] == list(range(acknowledged))
        code = server.stop()
        assert code == 0, server.log()
    with serve(tmp_path, address, "16MiB") as server:
        server.wait_serving(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
            reply = stub.Append(pb.AppendRequest(session_id="s", events=[say("after")]))
            assert reply.events[0].seq == acknowledged
            assert reply.next_seq == acknowledged + 1
