// Package epoch carries sessionlog's leadership epochs on a Go client's writes, as the Python
// and TypeScript clients do, so that a deposed primary (one restarted unfenced after a promotion
// elsewhere) never acknowledges a write of a client that knows better.
//
// Every write's reply, success or error, names the server's epoch in its trailing metadata
// (sessionlog-epoch; a sharded server names its group beside it, sessionlog-epoch-group). A
// Tracker keeps the highest epoch seen per group and sends it with every write; a server below it
// refuses the write NOT_PRIMARY and writes nothing. A write acknowledged at an epoch below the
// highest seen (a newer epoch learnt meanwhile, or a server too old to refuse) is not an
// acknowledgement: the call returns a *sessionlogerr.LeadershipLostError with Committed true;
// send it again, with the same request id, to the current primary.
//
// Install the interceptor when dialing, one Tracker per group of servers (share it between the
// connections to the members of one group):
//
//	tracker := epoch.NewTracker()
//	conn, err := grpc.Dial(target, grpc.WithInsecure(), tracker.DialOption())
//
// The Tracker moves no call: the Go client has no routing. A NOT_PRIMARY refusal comes back as
// a *sessionlogerr.NotPrimaryError; its Primary is only worth following when its Epoch is not
// below Tracker.Seen (a deposed server names whom it followed, which may be deposed too).
// Streams pass through unchanged (AppendStream included: send EpochMetadata yourself).
package epoch

import (
	"context"
	"fmt"
	"hash/crc32"
	"strconv"
	"sync"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sessionlog/sessionlog/client/go/sessionheader"
	"github.com/sessionlog/sessionlog/client/go/sessionlogerr"
)

const (
	// Key is the metadata of a server's epoch on every write reply (trailing) and of the highest
	// epoch a client has seen on every write it sends (request); also NOT_PRIMARY's ErrorInfo
	// metadata key "epoch".
	Key = "sessionlog-epoch"
	// GroupKey names a sharded server's group beside its epoch: each group elects its own
	// leaders, so epochs are kept, and sent, per group.
	GroupKey = "sessionlog-epoch-group"
	// slots is the number of shard slots; a session's slot is the CRC-32 of its id modulo it.
	slots = 1024
)

// Writes are the write RPCs (full method names): they carry the epoch both ways.
var Writes = map[string]bool{}

func init() {
	for _, name := range []string{
		"Append", "CreateSession", "SeedSession", "ForkSession", "AcquireLease", "RenewLease",
		"ReleaseLease", "ImportSession", "DeleteSession", "RedactEvents",
	} {
		Writes["/sessionlog.v1.SessionLogService/"+name] = true
	}
}

// Tracker is the highest leadership epoch seen per group ("" for a server that names no group:
// not sharded) and the group each session's slot last answered from. Safe for concurrent use.
type Tracker struct {
	mu     sync.Mutex
	epochs map[string]uint64
	slots  map[uint32]string
}

// NewTracker returns a Tracker that has seen no epoch.
func NewTracker() *Tracker {
	return &Tracker{epochs: map[string]uint64{}, slots: map[uint32]string{}}
}

// Epoch is the highest epoch seen, of any group (0: none yet).
func (t *Tracker) Epoch() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var highest uint64
	for _, epoch := range t.epochs {
		if epoch > highest {
			highest = epoch
		}
	}
	return highest
}

// Seen is the highest epoch seen of group ("": not sharded).
func (t *Tracker) Seen(group string) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.epochs[group]
}

// Learn records that a server of group named epoch in a reply for sessionID ("": none); false
// when epoch is below the group's highest seen before it: that server was deposed.
func (t *Tracker) Learn(epoch uint64, group, sessionID string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if group != "" && sessionID != "" {
		t.slots[slotOf(sessionID)] = group
	}
	if epoch == 0 {
		return true
	}
	seen := t.epochs[group]
	if epoch > seen {
		t.epochs[group] = epoch
	}
	return epoch >= seen
}

// EpochMetadata adds to ctx the epoch a write for sessionID carries: the highest seen of the
// group that answers for it (with the group's name when sharded); ctx itself while none is seen.
func (t *Tracker) EpochMetadata(ctx context.Context, sessionID string) context.Context {
	t.mu.Lock()
	group := ""
	if sessionID != "" && len(t.slots) > 0 {
		group = t.slots[slotOf(sessionID)]
	}
	epoch := t.epochs[group]
	t.mu.Unlock()
	if epoch == 0 {
		return ctx
	}
	pairs := []string{Key, strconv.FormatUint(epoch, 10)}
	if group != "" {
		pairs = append(pairs, GroupKey, group)
	}
	return metadata.AppendToOutgoingContext(ctx, pairs...)
}

// UnaryClientInterceptor sends the epoch with every write, learns the server's from its reply,
// and turns an acknowledgement below the epoch seen into a *sessionlogerr.LeadershipLostError.
// Reads pass through.
func (t *Tracker) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !Writes[method] {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		session := sessionheader.SessionOf(req)
		var trailer metadata.MD
		err := invoker(t.EpochMetadata(ctx, session), method, req, reply, cc,
			append(opts, grpc.Trailer(&trailer))...)
		epoch, group := named(trailer)
		current := t.Learn(epoch, group, session)
		if err != nil {
			var refused *sessionlogerr.NotPrimaryError
			if asNotPrimary(err, &refused) {
				t.Learn(refused.Epoch, group, "")
			}
			return err
		}
		if current {
			return nil
		}
		return leadershipLost(cc.Target(), epoch, t.Seen(group))
	}
}

// DialOption installs UnaryClientInterceptor (chained after any others).
func (t *Tracker) DialOption() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(t.UnaryClientInterceptor())
}

// named is the epoch and group a reply's trailers name (0, "": none).
func named(trailer metadata.MD) (uint64, string) {
	var epoch uint64
	group := ""
	if values := trailer.Get(Key); len(values) > 0 {
		epoch, _ = strconv.ParseUint(values[0], 10, 64)
	}
	if values := trailer.Get(GroupKey); len(values) > 0 {
		group = values[0]
	}
	return epoch, group
}

func asNotPrimary(err error, target **sessionlogerr.NotPrimaryError) bool {
	refused, ok := sessionlogerr.From(err).(*sessionlogerr.NotPrimaryError)
	if ok {
		*target = refused
	}
	return ok
}

// leadershipLost is the error of a write a deposed server acknowledged: UNAVAILABLE with the
// LEADERSHIP_LOST ErrorInfo (committed true), as the Python and TypeScript clients raise it.
func leadershipLost(target string, epoch, seen uint64) error {
	message := fmt.Sprintf("%s took the write at epoch %d, but this client has seen epoch %d: that "+
		"server was deposed, and what it stored is on a history the group discards when it "+
		"rejoins. The write is not acknowledged; send it again (with the same request id) to the "+
		"current primary", target, epoch, seen)
	st, err := status.New(codes.Unavailable, message).WithDetails(&errdetails.ErrorInfo{
		Reason:   sessionlogerr.ReasonLeadershipLost,
		Domain:   "sessionlog",
		Metadata: map[string]string{"committed": "true"},
	})
	if err != nil {
		return status.Error(codes.Unavailable, message)
	}
	return sessionlogerr.From(st.Err())
}

func slotOf(sessionID string) uint32 {
	return crc32.ChecksumIEEE([]byte(sessionID)) % slots
}
