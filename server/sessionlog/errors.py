"""The one vocabulary of sessionlog errors.

Every failure a client can see is one of these classes, each with a stable UPPER_SNAKE ``reason``
(SPEC §9). The domain raises them; ``sessionlog.service.errors`` is the single table that turns
them into gRPC status codes with a ``google.rpc.ErrorInfo`` detail, and a client can turn such a
status back into the same class with :func:`from_reason`.

    SessionLogError
    ├── InvalidArgument                     INVALID_ARGUMENT
    │   ├── UnknownEventType                UNKNOWN_EVENT_TYPE
    │   ├── SurfaceOpOnNonSurfaceEvent      SURFACE_OP_ON_NON_SURFACE_EVENT
    │   ├── InvalidSurfaceOp                INVALID_SURFACE_OP
    │   ├── UnserializableEventData         UNSERIALIZABLE_EVENT_DATA
    │   ├── MalformedRequest                MALFORMED_REQUEST
    │   ├── InvalidMessageField             INVALID_MESSAGE_FIELD
    │   ├── InvalidUsage                    INVALID_USAGE (an event's token usage; names the field)
    │   ├── RequestIdReused                 REQUEST_ID_REUSED
    │   ├── EventTooLarge                   EVENT_TOO_LARGE
    │   ├── SeqAssignedByServer             SEQ_ASSIGNED_BY_SERVER
    │   ├── InvalidSessionId                INVALID_SESSION_ID
    │   ├── BoundaryOutOfRange              BOUNDARY_OUT_OF_RANGE
    │   ├── InvalidLease                    INVALID_LEASE (bad holder name or TTL)
    │   ├── InvalidRequestId                INVALID_REQUEST_ID (longer than 256 bytes)
    │   ├── BatchTooLarge                   BATCH_TOO_LARGE (the reply would not fit a message)
    │   ├── TooManyEvents                   TOO_MANY_EVENTS (over the events-per-append limit)
    │   ├── InvalidEpoch                    INVALID_EPOCH (a fence without an epoch)
    │   ├── InvalidAddress                  INVALID_ADDRESS (not HOST:PORT)
    │   ├── ImportSeqNotDense               IMPORT_SEQ_NOT_DENSE (an import's seqs skip or repeat)
    │   ├── InvalidImport                   INVALID_IMPORT (an import's records disagree)
    │   ├── InvalidPageToken                INVALID_PAGE_TOKEN (not this listing's token)
    │   ├── InvalidPageSize                 INVALID_PAGE_SIZE (a negative page_size)
    │   ├── InvalidOrderBy                  INVALID_ORDER_BY (an order_by the RPC does not offer)
    │   ├── InvalidRedaction                INVALID_REDACTION (no seqs, or an empty prefix)
    │   ├── InvalidFilter                   INVALID_FILTER (a filter that cannot be evaluated)
    │   ├── InvalidUpdateMask               INVALID_UPDATE_MASK (an unknown or output-only path)
    │   ├── InvalidExpiration               INVALID_EXPIRATION (a past expire_time, a bad ttl)
    │   └── InvalidSessionField             INVALID_SESSION_FIELD (bad title, label, owner...)
    ├── SessionAlreadyExists                ALREADY_EXISTS
    ├── SessionNotFound                     NOT_FOUND (SESSION_NOT_FOUND: delete, redact, update)
    ├── FailedPrecondition                  FAILED_PRECONDITION
    │   ├── OpenTurn                        OPEN_TURN
    │   ├── LeaseHeld                       LEASE_HELD
    │   ├── LeaseLost                       LEASE_LOST
    │   ├── NotPrimary                      NOT_PRIMARY (metadata primary, epoch)
    │   ├── HistoryDiverged                 HISTORY_DIVERGED (the change feed's history differs)
    │   ├── AlreadyPrimary                  ALREADY_PRIMARY (promote of a server taking writes)
    │   ├── StaleEpoch                      STALE_EPOCH (an epoch not above the one known)
    │   ├── ClusterManaged                  CLUSTER_MANAGED (promote or fence of a --cluster member)
    │   ├── WrongGroup                      WRONG_GROUP (another group owns the session's slot)
    │   ├── SlotOwned                       SLOT_OWNED (a move's step where the slot is owned)
    │   ├── CrossGroupFork                  CROSS_GROUP_FORK (a fork's target in another group)
    │   ├── NotExpired                      NOT_EXPIRED (the sweeper's re-check: kept after all)
    │   ├── ImportSeqMismatch               IMPORT_SEQ_MISMATCH (a chunk not at the next seq)
    │   ├── FeedPositionAhead               FEED_POSITION_AHEAD (FollowSessions past the feed's end)
    │   └── FeedPositionGone                FEED_POSITION_GONE (before the feed's first position)
    ├── SeqConflict                         ABORTED
    ├── SessionUidMismatch                  ABORTED (SESSION_UID_MISMATCH: expected_uid differs)
    ├── Unauthenticated                     UNAUTHENTICATED (no or unknown bearer token)
    ├── PermissionDenied                    PERMISSION_DENIED (token lacks the right or prefix)
    ├── TooManyStreams                      RESOURCE_EXHAUSTED (TOO_MANY_STREAMS)
    ├── TooManySnapshots                    RESOURCE_EXHAUSTED (TOO_MANY_SNAPSHOTS)
    ├── StorageFull                         RESOURCE_EXHAUSTED
    ├── ResponseTooLarge                    RESOURCE_EXHAUSTED (RESPONSE_TOO_LARGE)
    ├── RequestTooLarge                     RESOURCE_EXHAUSTED (REQUEST_TOO_LARGE)
    ├── DataCorrupted                       DATA_LOSS (DATA_CORRUPTED: a stored record is damaged)
    ├── Unavailable                         UNAVAILABLE (shutting down; reconnect)
    ├── StorageIoError                      UNAVAILABLE (STORAGE_IO_ERROR: the disk failed a write)
    ├── GroupUnavailable                    UNAVAILABLE (GROUP_UNAVAILABLE: a group not listed)
    ├── LeadershipLost                      UNAVAILABLE (LEADERSHIP_LOST: may_write turned off)
    ├── ReplicasUnavailable                 UNAVAILABLE (REPLICAS_UNAVAILABLE: too few replicas)
    ├── ShardMapUnavailable                 UNAVAILABLE (SHARD_MAP_UNAVAILABLE: no map read yet)
    └── SlotMoving                          UNAVAILABLE (SLOT_MOVING: writes paused for a move)

Metadata values are strings, as ``ErrorInfo.metadata`` requires.
"""

from __future__ import annotations

from typing import ClassVar

DOMAIN = "sessionlog"


class SessionLogError(Exception):
    """Base of every sessionlog error: a reason, a sentence for people, and metadata."""

    reason: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str, **metadata: object) -> None:
        super().__init__(message)
        self.message = message
        self.metadata: dict[str, str] = {k: str(v) for k, v in metadata.items()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, reason={self.reason}, {self.metadata})"


class InvalidArgument(SessionLogError):
    """The request is wrong in itself; retrying it unchanged fails the same way."""

    reason = "INVALID_ARGUMENT"


class UnknownEventType(InvalidArgument):
    """An event's type is EVENT_TYPE_UNSPECIFIED or a number this server does not know.
    Metadata ``index``: the event's place in the request."""

    reason = "UNKNOWN_EVENT_TYPE"


class SurfaceOpOnNonSurfaceEvent(InvalidArgument):
    """A bookkeeping event (not a message, a tool result or a hide) carries a surface_op.
    Metadata ``index``."""

    reason = "SURFACE_OP_ON_NON_SURFACE_EVENT"


class InvalidSurfaceOp(InvalidArgument):
    """A replace or hide range with start_seq above stop_seq, or a hide without a replace
    range. Metadata ``index``."""

    reason = "INVALID_SURFACE_OP"


class UnserializableEventData(InvalidArgument):
    """An event's data or state_delta cannot be stored as JSON (a number that is not finite,
    nesting deeper than the limit, a time out of range). Metadata ``index``."""

    reason = "UNSERIALIZABLE_EVENT_DATA"


class MalformedRequest(InvalidArgument):
    """A request that cannot be decoded (bad UTF-8, a Struct nested past protobuf's limit) or
    a field that makes no sense as sent; the message names the field. A page token that is not
    one is INVALID_PAGE_TOKEN instead, whichever listing it was sent to."""

    reason = "MALFORMED_REQUEST"


class InvalidMessageField(InvalidArgument):
    """A message event's data has a known key of the wrong type (content that is not a
    string, say). Metadata ``index``, ``field``."""

    reason = "INVALID_MESSAGE_FIELD"


class InvalidUsage(InvalidArgument):
    """An event's token usage is wrong in itself: a model name that is empty, too long or
    holds control characters, a count over the per-event limit, more cached tokens than input
    tokens or more reasoning tokens than output tokens. Metadata ``index``, ``field``."""

    reason = "INVALID_USAGE"


class RequestIdReused(InvalidArgument):
    """A request_id already used on this session for a different request; a retry must send
    the same request again."""

    reason = "REQUEST_ID_REUSED"


class EventTooLarge(InvalidArgument):
    """An event is larger than --max-event-size. Metadata ``index``, ``size``, ``limit``."""

    reason = "EVENT_TOO_LARGE"


class SeqAssignedByServer(InvalidArgument):
    """An appended event has a non-zero seq; the server assigns seqs, leave it 0."""

    reason = "SEQ_ASSIGNED_BY_SERVER"


class InvalidSessionId(InvalidArgument):
    """A session id that is empty, too long (over 235 bytes) or has characters ids may not
    have."""

    reason = "INVALID_SESSION_ID"


class BoundaryOutOfRange(InvalidArgument):
    """A seq past the end of the session's log (a fork's at_seq, a read's at_seq, a seq to
    redact). Metadata ``next_seq``: the session's length."""

    reason = "BOUNDARY_OUT_OF_RANGE"


class InvalidLease(InvalidArgument):
    """A lease holder name that is empty or too long, or a TTL out of range."""

    reason = "INVALID_LEASE"


class InvalidRequestId(InvalidArgument):
    """A request_id longer than 256 bytes."""

    reason = "INVALID_REQUEST_ID"


class BatchTooLarge(InvalidArgument):
    """An append whose reply (which echoes its events) would not fit in one gRPC message;
    split it into smaller appends."""

    reason = "BATCH_TOO_LARGE"


class TooManyEvents(InvalidArgument):
    """More events in one call than --max-events-per-append allows; split the batch."""

    reason = "TOO_MANY_EVENTS"


class InvalidEpoch(InvalidArgument):
    """A fence asked without the newer epoch (epoch 0)."""

    reason = "INVALID_EPOCH"


class InvalidAddress(InvalidArgument):
    """An address that is not HOST:PORT (a host name or IP address, then a port from 1 to
    65535). Metadata ``field``."""

    reason = "INVALID_ADDRESS"


class ImportSeqNotDense(InvalidArgument):
    """An imported chunk's events do not carry consecutive seqs from its first_seq. Metadata
    ``index`` (the first event out of line), ``seq`` (what it carries), ``expected_seq``."""

    reason = "IMPORT_SEQ_NOT_DENSE"


class InvalidImport(InvalidArgument):
    """An ImportSession chunk whose records contradict each other or the server: a lease that
    expires before it was taken or lasts past the longest lease TTL, a request record past the
    session's events, a last-append time before the create time, a time far in the future.
    Metadata ``field`` names the field."""

    reason = "INVALID_IMPORT"


class InvalidPageToken(InvalidArgument):
    """A page_token (of any listing: ListSessions, ListLeaseAudit, ListEvents, DeriveMessages)
    that does not belong to this listing (another prefix, filter, order or at_seq, another
    RPC's) or no longer fits the session; start again without one. Metadata ``field``
    (page_token) and, where the frame refused it, ``rpc``."""

    reason = "INVALID_PAGE_TOKEN"


class InvalidPageSize(InvalidArgument):
    """A negative page_size (0 means the default)."""

    reason = "INVALID_PAGE_SIZE"


class InvalidOrderBy(InvalidArgument):
    """An order_by the RPC does not offer. Every RPC reads order_by with one grammar
    (AIP-132, one term: ``FIELD [asc|desc]``, case and extra spaces ignored). Metadata
    ``order_by`` (its first 60 characters) and ``rpc``."""

    reason = "INVALID_ORDER_BY"


class InvalidRedaction(InvalidArgument):
    """A redaction or erasure that names nothing: no seqs, an empty prefix, or a prefix no
    session id can start with."""

    reason = "INVALID_REDACTION"


class InvalidFilter(InvalidArgument):
    """A filter outside the supported AIP-160 subset (ListSessions, EraseSessions); the message
    names the spot."""

    reason = "INVALID_FILTER"


class InvalidUpdateMask(InvalidArgument):
    """An UpdateSession mask path that names no settable field (output-only or unknown)."""

    reason = "INVALID_UPDATE_MASK"


class InvalidExpiration(InvalidArgument):
    """An expire_time not after now or too far ahead, or a ttl that is not above 0 or too long
    (metadata ``field``)."""

    reason = "INVALID_EXPIRATION"


class InvalidSessionField(InvalidArgument):
    """A title, label, owner or status outside its rules (metadata ``field``)."""

    reason = "INVALID_SESSION_FIELD"


class SessionNotFound(SessionLogError):
    """A call that needs an existing session found none: a delete or redact of a session not
    stored (never written, or deleted), an UpdateSession, a sub-agent child's parent."""

    reason = "SESSION_NOT_FOUND"


class Unauthenticated(SessionLogError):
    """No bearer token, or one the server does not know."""

    reason = "UNAUTHENTICATED"


class PermissionDenied(SessionLogError):
    """A known token used outside its permissions or its session prefix."""

    reason = "PERMISSION_DENIED"


class TooManyStreams(SessionLogError):
    """Too many follow streams are open (per connection or in total); close some, retry later."""

    reason = "TOO_MANY_STREAMS"


class TooManySnapshots(SessionLogError):
    """As many snapshots as a server takes at once are being taken; retry when one is done."""

    reason = "TOO_MANY_SNAPSHOTS"


class SessionAlreadyExists(SessionLogError):
    """CreateSession, a fork or an import naming a session that already exists."""

    reason = "SESSION_ALREADY_EXISTS"


class FailedPrecondition(SessionLogError):
    """The request is valid but the session's state refuses it."""

    reason = "FAILED_PRECONDITION"


class OpenTurn(FailedPrecondition):
    """A fork at a seq inside a turn (a TURN_START whose TURN_END comes later). Metadata
    ``turn_start_seq``, ``at_seq``."""

    reason = "OPEN_TURN"


class LeaseHeld(FailedPrecondition):
    """Another holder has a live writer lease on the session: an append without it, or an
    AcquireLease while it lasts."""

    reason = "LEASE_HELD"


class LeaseLost(FailedPrecondition):
    """The caller's lease was taken over or released (or its fencing token is not the
    current one): it must not write any more."""

    reason = "LEASE_LOST"


class NotPrimary(FailedPrecondition):
    """A write sent to a server that does not take writes (a replica, or a primary fenced by a
    newer epoch, or one whose epoch is below the one the caller has seen). Nothing was written.
    Metadata ``primary``: where to send it ("" when no primary is known); ``epoch``: the highest
    epoch this server knows."""

    reason = "NOT_PRIMARY"

    @property
    def primary(self) -> str:
        """Where writes go, as this server knows it ("" when it knows no primary)."""
        return self.metadata.get("primary", "")

    @property
    def epoch(self) -> int:
        """The highest leadership epoch this server knows (0: none, or not sent)."""
        return _whole(self.metadata.get("epoch"))


class AlreadyPrimary(FailedPrecondition):
    """A promotion asked of a server that already takes writes."""

    reason = "ALREADY_PRIMARY"


class StaleEpoch(FailedPrecondition):
    """An epoch (a fence's, a promotion's) that is not above the one this server knows."""

    reason = "STALE_EPOCH"


class ClusterManaged(FailedPrecondition):
    """A manual promotion asked of a member of an etcd-elected group (--cluster): etcd elects
    its primary and hands out its epochs. Metadata ``group``: the group's name."""

    reason = "CLUSTER_MANAGED"


class SlotOwned(FailedPrecondition):
    """A slot move's step on a server whose group owns the slot (EraseSessions slot_copies, or
    a move's copy): its sessions there are live, not a move's copies; nothing was done.
    Metadata ``slot``, ``group`` (and ``session_id`` for a copy)."""

    reason = "SLOT_OWNED"


class WrongGroup(FailedPrecondition):
    """The call names a session whose slot another group owns (``--shard-map``): nothing was
    done. Send it to the owner. Metadata ``session_id``, ``slot``, ``group`` (the owner),
    ``primary`` (the owner's primary, "" when unknown), ``members`` (comma-separated) and
    ``map_epoch`` (the epoch of the map this server holds)."""

    reason = "WRONG_GROUP"

    @property
    def group(self) -> str:
        """The group that owns the session."""
        return self.metadata.get("group", "")

    @property
    def primary(self) -> str:
        """The owner group's primary ("" when this server does not know it)."""
        return self.metadata.get("primary", "")

    @property
    def members(self) -> list[str]:
        """The owner group's members."""
        text = self.metadata.get("members", "")
        return text.split(",") if text else []

    @property
    def slot(self) -> int:
        return _whole(self.metadata.get("slot"))

    @property
    def map_epoch(self) -> int:
        return _whole(self.metadata.get("map_epoch"))


class NotExpired(FailedPrecondition):
    """The retention sweeper's delete found, inside its transaction, that the session is no
    longer due (pinned, its expiry extended, or active again): nothing was deleted. Internal to
    the server's sweep; no RPC answers it."""

    reason = "NOT_EXPIRED"


class CrossGroupFork(FailedPrecondition):
    """A fork whose new session's slot lies in another group than its parent's: a fork copies
    within one group only. Pick a target id of the parent's group. Metadata ``source_slot``,
    ``source_group``, ``target_slot``, ``target_group``, ``map_epoch``."""

    reason = "CROSS_GROUP_FORK"


class ImportSeqMismatch(FailedPrecondition):
    """An import chunk's first_seq is not the session's next seq (a gap or an overlap): nothing
    was written. Metadata ``session_id``, ``first_seq``, ``next_seq`` (where to continue)."""

    reason = "IMPORT_SEQ_MISMATCH"


class FeedPositionAhead(FailedPrecondition):
    """A FollowSessions position past this server's change feed (another server's position,
    or a replica that has not caught up yet): nothing is streamed. Metadata ``after_position``
    and ``head_position``."""

    reason = "FEED_POSITION_AHEAD"


class FeedPositionGone(FailedPrecondition):
    """A FollowSessions position before the first change this store holds (a store restored or
    rejoined after it): the changes in between cannot be streamed. Metadata ``after_position``
    and ``first_position``; resume from_start, or read each session with Since."""

    reason = "FEED_POSITION_GONE"


class HistoryDiverged(FailedPrecondition):
    """The caller's change-feed position is not on this server's history: its record there is
    missing or differs (another primary, or one restored from an older backup). A replica's
    ChangesRequest.after_checksum (metadata ``position``, ``head_position``, ``history_id``), or
    a FollowSessions resume's after_checksum (metadata ``after_position``, ``head_position``):
    the follower resumes from a position this server sent, or from_start."""

    reason = "HISTORY_DIVERGED"


class SeqConflict(SessionLogError):
    """expected_seq did not match; re-read and retry with the reported next_seq."""

    reason = "SEQ_CONFLICT"


class SessionUidMismatch(SessionLogError):
    """An append's expected_uid is not the session's uid: the session was deleted and created
    again (or never existed) since the writer learnt its uid. Re-read the session and retry.
    Metadata ``uid``: the session's uid now (empty when it does not exist)."""

    reason = "SESSION_UID_MISMATCH"


class StorageFull(SessionLogError):
    """Nothing was written and reads keep working. Metadata ``cause``: ``map`` (the LMDB map is
    full: restart with a larger --map-size) or ``disk`` (free disk space: writes resume by
    themselves)."""

    reason = "STORAGE_FULL"


class ResponseTooLarge(SessionLogError):
    """The answer does not fit in one gRPC message; read less at a time, or raise the limit."""

    reason = "RESPONSE_TOO_LARGE"


class RequestTooLarge(SessionLogError):
    """The request is over the message size limit; send less at a time."""

    reason = "REQUEST_TOO_LARGE"


class DataCorrupted(SessionLogError):
    """A stored record could not be read back: the data file is damaged. Nothing is guessed;
    restore from a backup or a replica (`sessionlog admin verify` lists what is damaged)."""

    reason = "DATA_CORRUPTED"


class Unavailable(SessionLogError):
    """The server is shutting down; reconnect (a follower resumes from its next seq)."""

    reason = "UNAVAILABLE"


class StorageIoError(Unavailable):
    """The disk failed a write (an I/O error): nothing was written; retry later."""

    reason = "STORAGE_IO_ERROR"


class GroupUnavailable(Unavailable):
    """A cluster-wide session listing (``--shard-map``) reached no member of one group in time:
    the listing would miss that group's sessions, so none is returned. Retry once the group is
    back. Metadata ``group``: the group's name; ``members``: its members (comma-separated)."""

    reason = "GROUP_UNAVAILABLE"

    @property
    def group(self) -> str:
        """The group no member of which answered."""
        return self.metadata.get("group", "")


class LeadershipLost(Unavailable):
    """The server's process-level leadership check (``may_write``) turned off while the write
    was in flight: it may have been committed, but is not acknowledged. Retry with the same
    request id against the current primary; it finds the write if it survived. Metadata
    ``committed``: ``True`` when the check failed after the commit (the write may be stored),
    ``False`` when before it (nothing was written)."""

    reason = "LEADERSHIP_LOST"

    @property
    def committed(self) -> bool:
        """The write may be stored (the check failed after its commit)."""
        return self.metadata.get("committed", "").lower() == "true"


class ReplicasUnavailable(Unavailable):
    """Committed locally: retry with the same request id is safe. With --ack replica, too few
    replicas reported the write durable within --sync-timeout; the write IS committed on the
    primary (and may reach the replicas later), and a retry with the same request id returns
    the original result, without writing again, once enough replicas hold it. Metadata
    ``needed`` (--sync-replicas), ``counted`` (replicas that reported it), ``position`` (its
    change-feed position)."""

    reason = "REPLICAS_UNAVAILABLE"

    @property
    def needed(self) -> int:
        """How many replicas must hold a write before it is acknowledged (--sync-replicas)."""
        return _whole(self.metadata.get("needed"))

    @property
    def counted(self) -> int:
        """How many counting replicas reported holding this write in time."""
        return _whole(self.metadata.get("counted"))

    @property
    def position(self) -> int:
        """The write's change-feed position on the primary."""
        return _whole(self.metadata.get("position"))


class ShardMapUnavailable(Unavailable):
    """The server runs with ``--shard-map etcd`` and has not read a valid map (or its group is
    not in it) yet: it cannot tell which sessions it owns. Retry shortly."""

    reason = "SHARD_MAP_UNAVAILABLE"


class SlotMoving(Unavailable):
    """The session's slot is being moved to another group (``sessionlog cluster move-slot``):
    its writes pause for the moment the last events are copied, then the map gives the slot to
    the new group. Nothing was written; retry shortly (the retry may then be told WRONG_GROUP,
    naming the new owner). Metadata ``session_id``, ``slot``, ``map_epoch``."""

    reason = "SLOT_MOVING"


def _whole(text: str | None) -> int:
    """A metadata value as a whole number (0 when absent or not one)."""
    return int(text) if text is not None and text.isascii() and text.isdigit() else 0


def _all_subclasses(cls: type[SessionLogError]) -> list[type[SessionLogError]]:
    found: list[type[SessionLogError]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


_ALL: list[type[SessionLogError]] = [SessionLogError, *_all_subclasses(SessionLogError)]
BY_REASON: dict[str, type[SessionLogError]] = {cls.reason: cls for cls in _ALL}


def from_reason(reason: str, message: str, metadata: dict[str, str]) -> SessionLogError:
    """Rebuild the error a server raised from its ErrorInfo reason (unknown reasons: the base)."""
    cls = BY_REASON.get(reason, SessionLogError)
    return cls(message, **metadata)
