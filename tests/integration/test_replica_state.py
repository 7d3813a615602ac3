"""What a replica reports about its primary, from the frames it applied, over a real LMDB."""

from __future__ import annotations

import asyncio

from sessionlog.service.notifier import Notifier
from sessionlog.service.replication import ReplicaState, ReplicationServicer, Replicator
from sessionlog.storage.store import Store
from sessionlog.v1 import replication_service_pb2 as rpb


def heard(store: Store, state: ReplicaState, *heads: int) -> rpb.GetReplicationStatusResponse:
    """The status after the replica applied heartbeats carrying ``heads``, in order."""
    replicator = Replicator(store, state, on_caught_up=lambda: None)
    servicer = ReplicationServicer(store, Notifier(), replica=state)

    async def run() -> bytes:
        for head in heads:
            await replicator._handle(rpb.ChangesResponse(head_position=head).SerializeToString())
        raw = rpb.GetReplicationStatusRequest().SerializeToString()
        return await servicer.status(raw, None)  # a valid request: the context is never used

    return rpb.GetReplicationStatusResponse.FromString(asyncio.run(run()))


def test_primary_position_is_the_last_reported_not_the_largest(store: Store) -> None:
    """A primary that reports a lower head than before (restored from an older backup) is
    believed: primary_position follows it down instead of keeping the largest ever seen."""
    state = ReplicaState("primary:1", connected=True)
    assert heard(store, state, 100).primary_position == 100
    status = heard(store, state, 100, 40)
    assert (status.primary_position, status.lag_positions) == (40, 40)
    assert state.primary_position == 40


def test_lag_counts_against_the_primary_not_a_maximum(store: Store) -> None:
    """Lag is primary_position minus the position stored here, and a connected replica with
    lag is CATCHING_UP; disconnected, it is DISCONNECTED whatever it heard last."""
    state = ReplicaState("primary:1", connected=True)
    status = heard(store, state, 7)
    assert (status.position, status.primary_position, status.lag_positions) == (0, 7, 7)
    assert status.state == rpb.REPLICATION_STATE_CATCHING_UP
    state.connected = False
    status = heard(store, state)
    assert (status.connected, status.lag_positions) == (False, 7)
    assert status.state == rpb.REPLICATION_STATE_DISCONNECTED
