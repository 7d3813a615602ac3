"""AdminService: the store's stats, a streamed snapshot, promotion and fencing, for an operator.

Both read the store beside the writer (LMDB readers never block it). A snapshot is the
compacting copy of ``storage.snapshot``, taken in one read transaction, written to a temporary
folder beside the data folder, streamed from there in ``CHUNK_BYTES`` pieces, and removed when
the stream ends however it ends: sent, failed, or the client gone (then as soon as a copy still
running in its thread has finished). A stream holds one chunk in memory at a time, and gRPC's
flow control holds back a slow reader.

Promote and Fence change the server's role through ``cluster.promotion``. ListLeaseAudit pages
through every session's lease audit (``service.lease_audit``).

Every RPC needs the admin permission and a token with no session prefix (``service.auth``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

import grpc
import lmdb

from sessionlog import errors, fold
from sessionlog.cluster.promotion import Promoter
from sessionlog.records import parse_filter
from sessionlog.service import access
from sessionlog.service.auth import Authorizer
from sessionlog.service.convert import decode
from sessionlog.service.counters import Counters
from sessionlog.service.errors import abort
from sessionlog.service.lease_audit import list_lease_audit
from sessionlog.service.servicer import unary
from sessionlog.shard import SLOTS, slot_of
from sessionlog.shard.ownership import Ownership
from sessionlog.storage import snapshot
from sessionlog.storage.store import Store
from sessionlog.storage.usage import Usage, usage
from sessionlog.v1 import admin_service_pb2 as apb

log = logging.getLogger(__name__)

SERVICE_NAME = "sessionlog.v1.AdminService"
CHUNK_BYTES = 1 << 20


class AdminServicer:
    """AdminService over one store."""

    def __init__(
        self,
        store: Store,
        *,
        replica: bool = False,
        counters: Counters | None = None,
        max_message_bytes: int = 4 << 20,
        promoter: Promoter | None = None,
        elected_in: str = "",
        authorizer: Authorizer | None = None,
    ) -> None:
        self.store = store
        self.authorizer = authorizer
        """The tokens (None: auth off): EraseSessions narrows a tenant's erase to its prefix."""
        self.promoter = promoter
        self.elected_in = elected_in
        """The group whose election decides this server's role (--cluster): no Promote."""
        self.role = "replica" if replica else "primary"
        self.counters = counters or Counters()
        self.max_message_bytes = max_message_bytes
        self.ownership = Ownership(sharded=False)
        """The shard map and group GetStats reports (the server sets its own)."""

    def handlers(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "GetStats": grpc.unary_unary_rpc_method_handler(self.get_stats),
                "SaveSnapshot": grpc.unary_stream_rpc_method_handler(self.save_snapshot),
                "Promote": grpc.unary_unary_rpc_method_handler(self.promote),
                "Fence": grpc.unary_unary_rpc_method_handler(self.fence),
                "ListLeaseAudit": grpc.unary_unary_rpc_method_handler(self.list_lease_audit),
                "EraseSessions": grpc.unary_unary_rpc_method_handler(self.erase_sessions),
            },
        )

    def _promoter(self) -> Promoter:
        if self.promoter is None:
            raise errors.Unavailable("this server cannot change its role (no promoter wired)")
        return self.promoter

    def _refuse_if_elected(self, what: str) -> None:
        """A --cluster member's role and epochs are etcd's to give: a hand-made epoch would
        depose a leader that still holds its lease, and outrun every epoch etcd can give."""
        if self.elected_in:
            raise errors.ClusterManaged(
                f"this server is a member of group '{self.elected_in}' (--cluster): etcd elects "
                f"its primary and hands out its epochs, so it is not {what} by hand. Stop the "
                "leader (SIGTERM resigns at once) and a member that holds every acknowledged "
                "write takes over",
                group=self.elected_in,
            )

    @unary
    async def promote(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(apb.PromoteRequest, raw)
        self._refuse_if_elected("promoted")
        promotion = await self._promoter().promote(request.epoch)
        self.role = "primary"
        reply = apb.PromoteResponse(
            epoch=promotion.epoch,
            first_position=promotion.first_position,
            history_id=promotion.history_id,
            previous_primary=promotion.previous_primary,
        )
        serialized: bytes = reply.SerializeToString()
        return serialized

    @unary
    async def fence(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(apb.FenceRequest, raw)
        self._refuse_if_elected("fenced")
        before, after = await self._promoter().fence(request.epoch, request.primary)
        reply = apb.FenceResponse(epoch=after.epoch, stopped_writes=before.may_write)
        serialized: bytes = reply.SerializeToString()
        return serialized

    @unary
    async def list_lease_audit(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(apb.ListLeaseAuditRequest, raw)
        reply = list_lease_audit(self.store, self.ownership, request)
        serialized: bytes = reply.SerializeToString()
        return serialized

    @unary
    async def erase_sessions(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        request = decode(apb.EraseSessionsRequest, raw)
        principal = access.principal_of(self.authorizer, context.invocation_metadata())
        if request.HasField("slot_copies"):
            if principal is not None and principal.session_prefix:  # every tenant's sessions
                access.refuse_every_session(principal, "erasing a slot's copies")
            return await self._erase_slot_copies(request)
        query = parse_filter(request.filter)  # INVALID_FILTER before anything is erased
        if not request.prefix and not query.terms:
            raise errors.InvalidRedaction(
                "EraseSessions needs a non-empty prefix or a filter", field="prefix"
            )
        _check_erase_prefix(request.prefix)
        # A token limited to a session prefix erases only under it: a wider prefix (or none,
        # with a filter) is narrowed to the token's, one outside it is PERMISSION_DENIED.
        prefix = request.prefix if principal is None else principal.listing_prefix(request.prefix)
        self.ownership.check()  # sharded: erases this group's own sessions under the prefix
        sessions, events, position = await asyncio.to_thread(
            functools.partial(
                self.store.erase_prefix,
                prefix,
                query=query,
                actor=principal.name if principal is not None else "admin",
                reason=request.reason,
            )
        )
        reply = apb.EraseSessionsResponse(
            session_count=sessions, event_count=events, position=position
        )
        serialized: bytes = reply.SerializeToString()
        return serialized

    async def _erase_slot_copies(self, request: apb.EraseSessionsRequest) -> bytes:
        """EraseSessions(slot_copies): this server's copies of a slot its group does not own."""
        slot, ownership = request.slot_copies, self.ownership
        if not ownership.sharded:
            raise errors.SlotOwned(
                "this server is not sharded (no --shard-map): it owns every slot, so it holds "
                "no slot's copies; nothing was erased",
                slot=slot,
            )
        if slot >= SLOTS:
            raise errors.MalformedRequest(
                f"slot_copies {slot} is outside 0-{SLOTS - 1}", field="slot_copies"
            )
        ownership.check()  # a map must be held to tell a copy from an owned session

        def copy_of(session_id: str) -> errors.SessionLogError | None:
            if ownership.owns(session_id):
                return errors.SlotOwned(
                    f"group {ownership.group!r} owns slot {slot}: its sessions there are live, "
                    "not a move's copies; nothing was erased",
                    slot=slot,
                    group=ownership.group,
                )
            return None

        if ownership.owns_slot(slot):
            raise errors.SlotOwned(
                f"group {ownership.group!r} owns slot {slot}: its sessions there are live, not a "
                "move's copies; nothing was erased",
                slot=slot,
                group=ownership.group,
            )
        sessions, events, position = await asyncio.to_thread(
            functools.partial(
                self.store.erase_slot_copies,
                lambda session_id: slot_of(session_id) == slot,
                copy_of,
                actor="admin",
                reason=request.reason or f"slot {slot} copies, before a move",
            )
        )
        reply = apb.EraseSessionsResponse(
            session_count=sessions, event_count=events, position=position
        )
        serialized: bytes = reply.SerializeToString()
        return serialized

    @unary
    async def get_stats(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        decode(apb.GetStatsRequest, raw)
        store = self.store
        with store.env.begin() as txn:
            used = usage(store.env, store.tables, txn)
        history_id, history_start = store.history()
        reply = apb.GetStatsResponse(
            data_dir=str(store.path.absolute()),
            session_count=used.sessions,
            event_count=used.events,
            position=used.position,
            map_size=used.map_size,
            used_bytes=used.used_bytes,
            file_bytes=(store.path / snapshot.DATA_FILE).stat().st_size,
            readers=used.readers,
            history_id=history_id,
            history_start=history_start,
            role=self.role,
            map_epoch=self.ownership.settled_epoch,
            shard_group=self.ownership.group,
            owned_slots=self.ownership.owned_slots,
        )
        if used.head_commit_ns:
            reply.last_commit_time.FromNanoseconds(used.head_commit_ns)
        serialized: bytes = reply.SerializeToString()
        return serialized

    async def save_snapshot(
        self, raw: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Info, the copy's bytes, their SHA-256; the temporary copy never outlives the call."""
        refusal: errors.SessionLogError | None = None
        try:
            decode(apb.SaveSnapshotRequest, raw)
        except errors.SessionLogError as error:
            refusal = error
        if refusal is not None:
            await abort(context, refusal)
            return
        started = time.monotonic()
        store = self.store
        try:
            temporary = snapshot.temporary_folder(store.path)
        except errors.TooManySnapshots as error:
            await abort(context, error)
            return
        folder = temporary.path
        history_id = store.history()[0]
        copying = asyncio.ensure_future(asyncio.to_thread(_take, store, folder))
        try:
            try:
                copied, size = await asyncio.shield(copying)
            except (lmdb.Error, OSError) as exc:
                log.error("a snapshot failed", extra={"folder": str(folder), "error": str(exc)})
                refusal = snapshot.failure(exc, folder)
            except errors.SessionLogError as error:
                refusal = error
            if refusal is not None:
                await abort(context, refusal)
                return
            sent = 0
            async for response in _responses(folder / snapshot.DATA_FILE, size, copied, history_id):
                sent += len(response)
                yield response
            log.info(
                "snapshot sent",
                extra={
                    "bytes": sent,
                    "position": copied.position,
                    "seconds": round(time.monotonic() - started, 3),
                    "peer": context.peer(),
                },
            )
        finally:
            _discard_when_copied(copying, temporary)


def _take(store: Store, folder: Path) -> tuple[Usage, int]:
    """Copy the store into ``folder`` (see ``storage.snapshot``): what it holds, its size."""
    copied = snapshot.copy(store.env, store.tables, folder)
    return copied, (folder / snapshot.DATA_FILE).stat().st_size


async def _responses(path: Path, size: int, copied: Usage, history_id: str) -> AsyncIterator[bytes]:
    """The stream of one finished copy: info, chunks in file order, the SHA-256 of them all."""
    info = apb.SnapshotInfo(
        size_bytes=size,
        session_count=copied.sessions,
        event_count=copied.events,
        position=copied.position,
        map_size=copied.map_size,
        history_id=history_id,
    )
    if copied.head_commit_ns:
        info.last_commit_time.FromNanoseconds(copied.head_commit_ns)
    yield apb.SaveSnapshotResponse(info=info).SerializeToString()
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := await asyncio.to_thread(_read, source, digest):
            yield apb.SaveSnapshotResponse(chunk=chunk).SerializeToString()
    yield apb.SaveSnapshotResponse(sha256=digest.digest()).SerializeToString()


def _read(source: BinaryIO, digest: hashlib._Hash) -> bytes:
    """The next chunk, added to ``digest`` (off the event loop: both take a while per MiB)."""
    chunk = source.read(CHUNK_BYTES)
    digest.update(chunk)
    return chunk


def _discard_when_copied(
    copying: asyncio.Future[tuple[Usage, int]], temporary: snapshot.Temporary
) -> None:
    """Remove the temporary folder (and free its slot) now, or once the copy writing into it
    has finished."""

    def discard(done: asyncio.Future[tuple[Usage, int]]) -> None:
        if not done.cancelled():
            done.exception()  # retrieved: a copy that failed after its client left is not news
        temporary.discard()

    if copying.done():
        discard(copying)
    else:
        copying.add_done_callback(discard)


def _check_erase_prefix(prefix: str) -> None:
    """Refuse a prefix no session id can start with (``ann*``, ``ann 1``): every start of an id
    is itself an id, so such a prefix is a typo, and erasing nothing under it must not read as
    an erasure that found nothing."""
    if not prefix:
        return
    try:
        fold.check_session_id(prefix)
    except errors.InvalidSessionId as error:
        raise errors.InvalidRedaction(
            f"no session id starts with prefix {prefix[:60]!r} ({error.message}): nothing to "
            "erase under it; name the prefix the ids start with",
            field="prefix",
        ) from None
