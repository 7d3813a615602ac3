// Package sessionlogerr turns the errors of sessionlog calls into Go errors of their own type.
//
// A sessionlog server refuses a call with a gRPC status carrying one google.rpc.ErrorInfo detail
// (domain "sessionlog", a stable reason, metadata). From reads it:
//
//	reply, err := client.Append(ctx, request)
//	err = sessionlogerr.From(err)
//	var replicas *sessionlogerr.ReplicasUnavailableError
//	if errors.As(err, &replicas) {
//		// Committed locally: retry with the same request id is safe.
//	}
//
// The types:
//
//	*ServerError                 any sessionlog refusal: Code, Reason, Message, Metadata
//	*NotPrimaryError             NOT_PRIMARY: Primary (where writes go, "" if unknown), Epoch
//	*LeadershipLostError         LEADERSHIP_LOST: Committed (the write may be stored)
//	*ReplicasUnavailableError    REPLICAS_UNAVAILABLE: Needed, Counted, Position
//	*WrongGroupError             WRONG_GROUP: Group, Primary, Members, Slot, MapEpoch
//
// Each typed error unwraps to its *ServerError, which unwraps to the gRPC error; all of them
// answer status.FromError (GRPCStatus) with the original status.
package sessionlogerr

import (
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the ErrorInfo domain of every sessionlog refusal.
const Domain = "sessionlog"

// The reasons with a type of their own.
const (
	ReasonNotPrimary          = "NOT_PRIMARY"
	ReasonLeadershipLost      = "LEADERSHIP_LOST"
	ReasonReplicasUnavailable = "REPLICAS_UNAVAILABLE"
	ReasonWrongGroup          = "WRONG_GROUP"
)

// Reasons of sharded servers (--shard-map) that have no type of their own.
const (
	// ReasonCrossGroupFork (FAILED_PRECONDITION): a fork's new session lies in another group.
	ReasonCrossGroupFork = "CROSS_GROUP_FORK"
	// ReasonShardMapUnavailable (UNAVAILABLE): the server has read no shard map yet; retry.
	ReasonShardMapUnavailable = "SHARD_MAP_UNAVAILABLE"
	// ReasonGroupUnavailable (UNAVAILABLE): a cluster-wide ListSessions reached no member of one
	// group (metadata group, members), so it listed nothing; retry.
	ReasonGroupUnavailable = "GROUP_UNAVAILABLE"
	// ReasonSlotMoving (UNAVAILABLE): the session's slot is being moved to another group and its
	// writes pause for the move's last copy (metadata session_id, slot, map_epoch); retry.
	ReasonSlotMoving = "SLOT_MOVING"
)

// ServerError is a refusal by a sessionlog server: its status code, the stable reason from the
// ErrorInfo detail, the message (which says what to do) and the metadata.
type ServerError struct {
	Code     codes.Code
	Reason   string
	Message  string
	Metadata map[string]string
	cause    error
	status   *status.Status
}

func (e *ServerError) Error() string {
	return fmt.Sprintf("sessionlog %s (%s): %s", e.Reason, e.Code, e.Message)
}

// Unwrap gives the gRPC error the call returned.
func (e *ServerError) Unwrap() error { return e.cause }

// GRPCStatus is the original status, so status.FromError and status.Code keep working.
func (e *ServerError) GRPCStatus() *status.Status { return e.status }

// NotPrimaryError (FAILED_PRECONDITION / NOT_PRIMARY): a write sent to a server that takes no
// writes (a replica, a fenced primary, or one at an epoch below the one the caller has seen).
// Nothing was written: send it to Primary.
type NotPrimaryError struct {
	*ServerError
	// Primary is where writes go, as that server knows it ("" when it knows no primary).
	Primary string
	// Epoch is the highest leadership epoch that server knows.
	Epoch uint64
}

// Unwrap gives the *ServerError.
func (e *NotPrimaryError) Unwrap() error { return e.ServerError }

// LeadershipLostError (UNAVAILABLE / LEADERSHIP_LOST): the server lost its leadership while the
// write was in flight. It is not acknowledged; retry with the same request id against the
// current primary (it finds the write if it survived).
type LeadershipLostError struct {
	*ServerError
	// Committed: the check failed after the commit, so the write may be stored.
	Committed bool
}

// Unwrap gives the *ServerError.
func (e *LeadershipLostError) Unwrap() error { return e.ServerError }

// ReplicasUnavailableError (UNAVAILABLE / REPLICAS_UNAVAILABLE, a primary with --ack replica):
// committed locally: retry with the same request id is safe. Fewer than Needed replicas
// reported the write within --sync-timeout; a retry with the same request id returns the
// original result, without writing again, once enough replicas hold it.
type ReplicasUnavailableError struct {
	*ServerError
	// Needed is --sync-replicas: how many replicas must hold a write before it is acknowledged.
	Needed int
	// Counted is how many counting replicas reported holding it in time.
	Counted int
	// Position is the write's change-feed position on the primary.
	Position uint64
}

// Unwrap gives the *ServerError.
func (e *ReplicasUnavailableError) Unwrap() error { return e.ServerError }

// WrongGroupError (FAILED_PRECONDITION / WRONG_GROUP, a server with --shard-map): another group
// owns the session's slot; nothing was done. Send the call to Primary (a read: any of Members).
type WrongGroupError struct {
	*ServerError
	// Group is the group that owns the session.
	Group string
	// Primary is the owner group's primary ("" when the server does not know it).
	Primary string
	// Members are the owner group's members.
	Members []string
	// Slot is the session's slot (crc32 of its UTF-8 id, mod 1024).
	Slot int
	// MapEpoch is the epoch of the shard map the refusing server holds.
	MapEpoch uint64
}

// Unwrap gives the *ServerError.
func (e *WrongGroupError) Unwrap() error { return e.ServerError }

// From returns err as the sessionlog error it carries: a *NotPrimaryError,
// *LeadershipLostError, *ReplicasUnavailableError or *WrongGroupError for those reasons, a *ServerError for any
// other sessionlog reason, and err itself when it carries none (nil, a transport failure, a
// deadline).
func From(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	info := errorInfo(st)
	if info == nil {
		return err
	}
	base := &ServerError{
		Code:     st.Code(),
		Reason:   info.Reason,
		Message:  st.Message(),
		Metadata: info.Metadata,
		cause:    err,
		status:   st,
	}
	if base.Metadata == nil {
		base.Metadata = map[string]string{}
	}
	switch info.Reason {
	case ReasonNotPrimary:
		return &NotPrimaryError{base, base.Metadata["primary"], whole(base.Metadata["epoch"])}
	case ReasonLeadershipLost:
		return &LeadershipLostError{base, strings.EqualFold(base.Metadata["committed"], "true")}
	case ReasonReplicasUnavailable:
		return &ReplicasUnavailableError{
			ServerError: base,
			Needed:      int(whole(base.Metadata["needed"])),
			Counted:     int(whole(base.Metadata["counted"])),
			Position:    whole(base.Metadata["position"]),
		}
	case ReasonWrongGroup:
		var members []string
		if text := base.Metadata["members"]; text != "" {
			members = strings.Split(text, ",")
		}
		return &WrongGroupError{
			ServerError: base,
			Group:       base.Metadata["group"],
			Primary:     base.Metadata["primary"],
			Members:     members,
			Slot:        int(whole(base.Metadata["slot"])),
			MapEpoch:    whole(base.Metadata["map_epoch"]),
		}
	}
	return base
}

// errorInfo is the status's sessionlog ErrorInfo detail, or nil.
func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok && info.Domain == Domain {
			return info
		}
	}
	return nil
}

// whole reads a metadata value as a whole number (0 when absent or not one).
func whole(text string) uint64 {
	n, err := strconv.ParseUint(text, 10, 64)
	if err != nil {
		return 0
	}
	return n
}
