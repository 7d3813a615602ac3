"""kill -9 under pipelined AppendStream load: every acknowledged append survives, in order.

A real `sessionlog serve` process takes appends from several streams at once, each stream
pipelining up to ``IN_FLIGHT`` unanswered one-event appends over its own sessions, every
append naming the seq it must get (``expected_seq``) and carrying a request id and a unique
``uid``. After a random delay the server is killed with SIGKILL and started again on the same
data, and each session's log is checked against what its stream sent and was told:

- its events are exactly the first N appends the stream sent to it, in stream order, seqs dense
  from 0 (nothing was reordered, nothing written that was not sent, nothing twice);
- every append that was answered as written is among them, at the seq and with the time and
  data its reply carried (an acknowledgement is never taken back);
- no append was refused (each names the seq it gets, on sessions only its stream writes);
- resending the first unanswered append of a session with its request id after the restart
  either replays it (it had been written) or writes it at the next seq, never twice.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sessionlog.v1 import event_pb2
from sessionlog.v1 import session_log_service_pb2 as pb
from sessionlog.v1 import session_log_service_pb2_grpc as pb_grpc
from tests.e2e._proc import ServerProcess, free_port

pytestmark = pytest.mark.workers  # a crash of a server of several processes, in workers mode

APPEND_STREAM = "/sessionlog.v1.SessionLogService/AppendStream"
CYCLES = 3
STREAMS = 3
SESSIONS_PER_STREAM = 3
IN_FLIGHT = 300
SEED = 7


class StreamWriter(threading.Thread):
    """One AppendStream pipelining appends to its own sessions until the server dies."""

    def __init__(self, name: str, address: str, sessions: list[str], stop: threading.Event):
        super().__init__(name=name, daemon=True)
        self.address = address
        self.sessions = sessions
        self.stop = stop
        self.sent: dict[str, list[str]] = {session: [] for session in sessions}
        """Per session, the uids of the appends sent to it, in stream order."""
        self.acked: dict[str, event_pb2.Event] = {}
        """uid -> the event its reply says was written."""
        self.refused: list[str] = []
        self._pending: dict[int, tuple[str, str]] = {}
        self._slots = threading.Semaphore(IN_FLIGHT)
        self._lock = threading.Lock()

    def requests(self) -> Iterator[bytes]:
        for number in itertools.count(1):
            while not self._slots.acquire(timeout=0.05):
                if self.stop.is_set():
                    return
            if self.stop.is_set():
                return
            session = self.sessions[number % len(self.sessions)]
            uid = f"{self.name}-{number}"
            sent = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)
            sent.data.update({"uid": uid, "content": "x" * (number % 50)})
            with self._lock:
                expected = len(self.sent[session])
                self.sent[session].append(uid)
                self._pending[number] = (session, uid)
            append = pb.AppendRequest(
                session_id=session, events=[sent], expected_seq=expected, request_id=uid
            )
            yield pb.AppendStreamRequest(correlation_id=number, append=append).SerializeToString()

    def run(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            call = channel.stream_stream(APPEND_STREAM)
            try:
                for raw in call(self.requests(), timeout=60):
                    reply = pb.AppendStreamResponse.FromString(raw)
                    with self._lock:
                        _, uid = self._pending.pop(reply.correlation_id)
                    if reply.HasField("append"):
                        (self.acked[uid],) = reply.append.events
                    else:
                        self.refused.append(f"{uid}: {reply.error.reason}")
                    self._slots.release()
            except grpc.RpcError:
                pass  # the server was killed: what is pending stays unanswered


def stored(stub: pb_grpc.SessionLogServiceStub, session_id: str) -> list[event_pb2.Event]:
    request = pb.SinceRequest(session_id=session_id)
    return [e for reply in stub.Since(request, timeout=30) for e in reply.events]


def check(stub: pb_grpc.SessionLogServiceStub, writer: StreamWriter) -> tuple[int, int]:
    """The checks of the module docstring for one stream's sessions; (acked, stored) counts."""
    assert writer.refused == []
    acked = stored_count = 0
    for session, sent in writer.sent.items():
        events = stored(stub, session)
        uids = [str(e.data["uid"]) for e in events]
        assert [e.seq for e in events] == list(range(len(events))), session
        assert uids == sent[: len(uids)], f"{session}: not the stream's appends in order"
        for uid, event in zip(uids, events, strict=True):
            if uid in writer.acked:
                assert writer.acked[uid] == event
        answered = [uid for uid in sent if uid in writer.acked]
        assert set(answered) <= set(uids), f"{session}: an acknowledged append is gone"
        acked += len(answered)
        stored_count += len(events)
        if len(sent) > len(uids):
            resend_first_unanswered(stub, session, sent, uids)
    return acked, stored_count


def resend_first_unanswered(
    stub: pb_grpc.SessionLogServiceStub, session: str, sent: list[str], uids: list[str]
) -> None:
    """The first append sent but not stored, sent again with its request id: written once, at
    the next seq; sent once more, replayed."""
    uid = sent[len(uids)]
    again = event_pb2.Event(type=event_pb2.EVENT_TYPE_USER_MESSAGE)
    again.data.update({"uid": uid, "content": "x" * (int(uid.rsplit("-", 1)[1]) % 50)})
    request = pb.AppendRequest(session_id=session, events=[again], request_id=uid)
    first = stub.Append(request, timeout=30)
    assert [e.seq for e in first.events] == [len(uids)]
    assert stub.Append(request, timeout=30) == first
    assert len(stored(stub, session)) == len(uids) + 1


@pytest.mark.timeout(240)
def test_acknowledged_stream_appends_survive_kill_9(tmp_path: Path) -> None:
    """SIGKILL at a random moment under several pipelining streams, three times over: after
    each restart the logs hold every acknowledged append, in stream order, and nothing else
    but a prefix of what was sent."""
    data, rng = tmp_path / "data", random.Random(SEED)
    totals = [0, 0]
    for cycle in range(CYCLES):
        address = f"127.0.0.1:{free_port()}"
        with ServerProcess(["--data", str(data), "--listen", address], cwd=tmp_path) as server:
            server.wait_serving(address)
            stop = threading.Event()
            writers = [
                StreamWriter(
                    f"c{cycle}s{n}",
                    address,
                    [f"kill.c{cycle}.s{n}.{k}" for k in range(SESSIONS_PER_STREAM)],
                    stop,
                )
                for n in range(STREAMS)
            ]
            for writer in writers:
                writer.start()
            time.sleep(rng.uniform(0.5, 1.5))
            server.kill()
            stop.set()
            for writer in writers:
                writer.join(30)
                assert not writer.is_alive(), f"{writer.name} hung"
        address = f"127.0.0.1:{free_port()}"
        with ServerProcess(["--data", str(data), "--listen", address], cwd=tmp_path) as server:
            server.wait_serving(address)
            with grpc.insecure_channel(address) as channel:
                stub = pb_grpc.SessionLogServiceStub(channel)  # type: ignore[no-untyped-call]
                for writer in writers:
                    acked, count = check(stub, writer)
                    totals[0] += acked
                    totals[1] += count
            assert server.stop() == 0
    assert totals[0] > 0, "no append was acknowledged before a kill"
    print(f"\nappend stream crash: {totals[0]} acknowledged, {totals[1]} stored, {CYCLES} kills")
