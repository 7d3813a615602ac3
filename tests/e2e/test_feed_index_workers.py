"""The change feed's index by session (``storage.feed_index``) when several processes write one
folder (`sessionlog serve --workers 2`): each worker's writer indexes its own commit groups in
the transaction that stores them, so a delete through one worker finds the session's records
that the other wrote, and the folder verifies."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

from sessionlog.storage import changes, integrity
from sessionlog.storage.store import Store
from sessionlog.v1 import replication_service_pb2 as rpb
from sessionlog.v1 import session_log_service_pb2 as pb
from tests.e2e._helpers import say
from tests.e2e._workers import stubs_by_worker, workers


def test_a_delete_through_one_worker_erases_the_records_the_other_wrote(tmp_path: Path) -> None:
    """Appends to one session alternate between the two workers (with another session's
    between); the delete goes through the second: no record names the session but the
    delete's own, the index names exactly the records naming each session, verify is clean."""
    with workers(tmp_path, 2) as server:
        first, second = stubs_by_worker(server)
        for n in range(12):
            stub = first if n % 2 == 0 else second
            stub.Append(pb.AppendRequest(session_id="shared", events=[say(f"m{n}")]), timeout=10)
            stub.Append(pb.AppendRequest(session_id="kept", events=[say(f"k{n}")]), timeout=10)
        second.DeleteSession(pb.DeleteSessionRequest(session_id="shared"), timeout=10)
        data = server.data
    with closing(Store(data)) as store:
        feed = [rpb.Change.FromString(raw) for raw in store.read_changes(1)]
        naming = sorted((c.session_id, c.position) for c in feed if c.session_id)
        with store.env.begin() as txn:
            keys = [bytes(k) for k, _ in txn.cursor(db=store.tables.feed_index) if len(k) > 9]
        indexed = sorted((k[:-9].decode(), int.from_bytes(k[-8:], "big")) for k in keys)
        assert indexed == naming
        shared = [c for c in feed if c.session_id == "shared"]
        assert [c.kind for c in shared] == [rpb.CHANGE_KIND_DELETE]
        assert sum(1 for c in feed if c.session_id == "kept") == 12
        found, _ = integrity.verify(
            store.env, store.tables, change_checks=[changes.ChecksumChain()]
        )
        assert found == []
