"""Every group's followed sessions, with a cursor per group (`sessionlog tail --prefix P
--every-group`).

A sharded cluster has one change feed per group: each group's primary numbers its own changes
from 1 and its replicas hold the same feed, so a position means something within its group only,
and each group's FollowSessions streams that group's own sessions. A consumer of the whole
cluster therefore keeps one cursor per group: the groups and their members come from
``GetShardMap`` (any server), and each group is followed (``SessionLogService.FollowSessions``,
which a tenant token may call for its own prefix) on its primary, else on its other members in
turn (any member serves it). A lost connection resumes that group from its cursor, at the next
member; the other groups go on meanwhile. Changes of one group arrive in order; of two groups,
in no particular order with each other.

A slot that moves shows its sessions' events a second time, as the copy in the target group's
feed (same session, same seqs). ``follow_groups`` yields each ``(session, seq)`` once: it keeps
the next seq it expects of every session it has yielded and passes over an event below it.
Erasures are shown too: a redaction's rewritten events, and a deletion (as a line without an
event), after which the session's seqs start again from 0.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from sessionlog_client.v1 import event_pb2
from sessionlog_client.v1 import replication_service_pb2 as rpb
from sessionlog_client.v1 import session_log_service_pb2 as pb
from sessionlog_client.v1 import session_log_service_pb2_grpc as pb_grpc

HEARTBEAT_SECONDS = 15


@dataclass(frozen=True)
class Line:
    """One event of the cluster's feeds: its group, its position in that group's feed."""

    group: str
    position: int
    session_id: str
    event: event_pb2.Event | None
    """None: the session was deleted (a DELETE change)."""


Connect = Callable[[str], Any]
"""A client of one address (``sessionlog_client.Client``, the CLI's --token, TLS and retry
settings): a context manager with ``channel`` and ``connection.call_metadata()``."""
Backoff = Callable[[], Any]
"""A fresh ``sessionlog_client`` Backoff: next() -> seconds to wait, or None to give up."""


def groups_of(client: Any, timeout: float | None) -> list[tuple[str, list[str]]]:
    """Each group of the map the server holds, with its members, its primary first."""
    stub: Any = pb_grpc.SessionLogServiceStub(client.channel)  # type: ignore[no-untyped-call]
    reply: pb.GetShardMapResponse = stub.GetShardMap(
        pb.GetShardMapRequest(), metadata=client.connection.call_metadata(), timeout=timeout
    )
    found = []
    for group in reply.shard_map.groups:
        first = [group.primary] if group.primary else []
        found.append((group.name, list(dict.fromkeys([*first, *group.members]))))
    return found


def follow_groups(
    groups: list[tuple[str, list[str]]],
    connect: Connect,
    backoff: Backoff,
    *,
    prefix: str,
    follow: bool,
    cursors: Mapping[str, int],
    filter_text: str = "",
) -> Iterator[Line]:
    """The events of sessions under ``prefix`` from every group's feed, each group from its
    cursor (``cursors[name]``, default 1), until every feed ends (without ``follow``) or a
    group's feed fails for good (its error is raised)."""
    lines: queue.Queue[Line | BaseException | str] = queue.Queue(maxsize=1024)
    stop = threading.Event()
    for name, members in groups:
        start = max(1, cursors.get(name, 1))
        thread = threading.Thread(
            target=_follow_one,
            args=(
                name,
                members,
                start,
                connect,
                backoff(),
                pb.FollowSessionsRequest(prefix=prefix, filter=filter_text),
                follow,
                lines,
                stop,
            ),
            name=f"feed-{name}",
            daemon=True,
        )
        thread.start()
    running = len(groups)
    fresh = FirstSight()
    try:
        while running:
            item = lines.get()
            if isinstance(item, str):
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            elif fresh(item):
                yield item
    finally:
        stop.set()


def change_events(change: rpb.Change) -> list[event_pb2.Event | None]:
    """What a follower of the feed shows of a change: its events; for a REDACT the events it
    rewrote, as now stored; for a DELETE one None; for a later erase's placeholder of a deleted
    session's record, nothing."""
    if change.erased and not change.session_id:
        return []
    if change.kind == rpb.CHANGE_KIND_DELETE:
        return [None]
    if change.kind == rpb.CHANGE_KIND_REDACT:
        rewritten = [put.value for put in change.puts if put.table == "events"]
        return [event_pb2.Event.FromString(value) for value in rewritten]
    return list(change.events)


class FirstSight:
    """True for the first line of each ``(session, seq)``, False for a repeat (a moved slot's
    copy in its new group's feed, or the original after the copy came first). A session's seqs
    arrive in order within a feed, so the next seq expected of each session is all it keeps."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def __call__(self, line: Line) -> bool:
        if line.event is None:  # deleted: a new log of the id starts again at seq 0
            self._next.pop(line.session_id, None)
            return True
        if line.event.HasField("redacted"):  # a rewrite of an event already shown
            return True
        expected = self._next.get(line.session_id, 0)
        if line.event.seq < expected:
            return False
        self._next[line.session_id] = line.event.seq + 1
        return True


def _follow_one(
    name: str,
    members: list[str],
    position: int,
    connect: Connect,
    backoff: Any,
    asked: pb.FollowSessionsRequest,
    follow: bool,
    out: queue.Queue[Line | BaseException | str],
    stop: threading.Event,
) -> None:
    """One group's followed sessions from ``position`` on, moving to its next member after a
    lost stream; without ``follow``, until the group's stream is caught up."""
    turn = 0
    try:
        while not stop.is_set():
            address = members[turn % len(members)]
            with connect(address) as client:
                stub: Any = pb_grpc.SessionLogServiceStub(client.channel)  # type: ignore[no-untyped-call]
                request = pb.FollowSessionsRequest()
                request.CopyFrom(asked)
                request.after_position = position - 1
                request.from_start = position <= 1
                request.heartbeat_interval.FromSeconds(HEARTBEAT_SECONDS)
                call = stub.FollowSessions(request, metadata=client.connection.call_metadata())
                try:
                    for response in call:
                        backoff.reset()
                        for change in response.changes:
                            position = change.position + 1
                            events: list[event_pb2.Event | None] = (
                                [None] if change.deleted else list(change.events)
                            )
                            for event in events:
                                line = Line(name, change.position, change.session_id, event)
                                _put(out, line, stop)
                        position = max(position, response.position + 1)
                        if stop.is_set() or (response.caught_up and not follow):
                            return
                    return
                except grpc.RpcError as error:
                    lost = error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
                    delay = backoff.next() if lost and not stop.is_set() else None
                    if delay is None:
                        raise
                finally:
                    call.cancel()
            turn += 1
            time.sleep(delay)
    except BaseException as error:  # handed to the reading thread, which raises it
        _put(out, error, stop)
    finally:
        _put(out, name, stop)


def _put(out: queue.Queue[Line | BaseException | str], item: Any, stop: threading.Event) -> None:
    """Hand ``item`` over unless the reader has gone (bounded waits: never stuck on a full
    queue nobody reads)."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.5)
            return
        except queue.Full:
            continue
