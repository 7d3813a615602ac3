package epoch_test

// The Tracker against a running server, whose address SESSIONLOG_TEST_ADDRESS names
// (tests/e2e/test_client_go.py sets it; the tests skip without it).

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sessionlog/sessionlog/client/go/epoch"
	sessionlogv1 "github.com/sessionlog/sessionlog/client/go/sessionlog/v1"
	"github.com/sessionlog/sessionlog/client/go/sessionlogerr"
)

func dial(t *testing.T, options ...grpc.DialOption) (sessionlogv1.SessionLogServiceClient, context.Context) {
	t.Helper()
	target := os.Getenv("SESSIONLOG_TEST_ADDRESS")
	if target == "" {
		t.Skip("SESSIONLOG_TEST_ADDRESS is not set (the address of a running sessionlog server)")
	}
	conn, err := grpc.Dial(target, append(options, grpc.WithInsecure())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return sessionlogv1.NewSessionLogServiceClient(conn), ctx
}

func appendOne(ctx context.Context, client sessionlogv1.SessionLogServiceClient, session string) error {
	data, err := structpb.NewStruct(map[string]interface{}{"content": "hello"})
	if err != nil {
		return err
	}
	_, err = client.Append(ctx, &sessionlogv1.AppendRequest{
		SessionId: session,
		RequestId: session + "-1",
		Events:    []*sessionlogv1.Event{{Type: sessionlogv1.EventType_EVENT_TYPE_USER_MESSAGE, Data: data}},
	})
	return err
}

func eventCount(ctx context.Context, t *testing.T, client sessionlogv1.SessionLogServiceClient, session string) uint64 {
	t.Helper()
	reply, err := client.GetSession(ctx, &sessionlogv1.GetSessionRequest{SessionId: session})
	if status.Code(err) == codes.NotFound {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return reply.GetSession().GetEventCount()
}

// A write's reply teaches the Tracker the server's epoch; once it knows a higher one, the server
// refuses its writes NOT_PRIMARY (naming its own epoch) and stores nothing; reads pass.
func TestWritesLearnAndSendTheEpoch(t *testing.T) {
	tracker := epoch.NewTracker()
	client, ctx := dial(t, tracker.DialOption())
	if err := appendOne(ctx, client, "go-epoch-learnt"); err != nil {
		t.Fatal(err)
	}
	known := tracker.Epoch()
	if known == 0 {
		t.Fatal("the append's reply named no epoch")
	}
	tracker.Learn(known+1, "", "") // as from a reply of a newer primary elsewhere
	err := appendOne(ctx, client, "go-epoch-refused")
	var refused *sessionlogerr.NotPrimaryError
	if !errors.As(sessionlogerr.From(err), &refused) {
		t.Fatalf("want a *NotPrimaryError, got %v", err)
	}
	if refused.Epoch != known {
		t.Fatalf("the refusal names epoch %d, want the server's %d", refused.Epoch, known)
	}
	if n := eventCount(ctx, t, client, "go-epoch-refused"); n != 0 {
		t.Fatalf("a refused write stored %d events", n)
	}
	if tracker.Epoch() != known+1 {
		t.Fatalf("the tracker went back to epoch %d", tracker.Epoch())
	}
}

// An acknowledgement from a server below the epoch the Tracker knows by the time it arrives
// (learnt meanwhile, from another reply) is a *LeadershipLostError, Committed: it may be stored.
func TestAnAckBelowTheEpochSeenIsLeadershipLost(t *testing.T) {
	tracker := epoch.NewTracker()
	meanwhile := func(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if req.(interface{ GetSessionId() string }).GetSessionId() == "go-epoch-late" {
			tracker.Learn(tracker.Epoch()+1, "", "")
		}
		return err
	}
	client, ctx := dial(t, tracker.DialOption(), grpc.WithChainUnaryInterceptor(meanwhile))
	if err := appendOne(ctx, client, "go-epoch-before"); err != nil || tracker.Epoch() == 0 {
		t.Fatalf("the first append: %v, epoch %d", err, tracker.Epoch())
	}
	err := appendOne(ctx, client, "go-epoch-late")
	var lost *sessionlogerr.LeadershipLostError
	if !errors.As(sessionlogerr.From(err), &lost) {
		t.Fatalf("want a *LeadershipLostError, got %v", err)
	}
	if !lost.Committed || lost.Code != codes.Unavailable {
		t.Fatalf("want UNAVAILABLE, committed; got %v committed=%v", lost.Code, lost.Committed)
	}
	if n := eventCount(ctx, t, client, "go-epoch-late"); n != 1 {
		t.Fatalf("the deposed server stored %d events, want 1 (it took the write)", n)
	}
}
