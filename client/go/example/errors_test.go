package main

// Errors as a Go worker meets them: a gRPC status with one google.rpc.ErrorInfo detail (domain
// "sessionlog", a stable reason, metadata). The tests need a running server; they read its
// address from SESSIONLOG_TEST_ADDRESS (tests/e2e/test_client_go.py sets it) and skip without it.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sessionlogv1 "github.com/sessionlog/sessionlog/client/go/sessionlog/v1"
	"github.com/sessionlog/sessionlog/client/go/sessionlogerr"
)

// testAddress is the running server's address, from SESSIONLOG_TEST_ADDRESS ("" when unset).
func testAddress() string {
	return os.Getenv("SESSIONLOG_TEST_ADDRESS")
}

func dial(t *testing.T) (sessionlogv1.SessionLogServiceClient, context.Context) {
	t.Helper()
	target := testAddress()
	if target == "" {
		t.Skip("SESSIONLOG_TEST_ADDRESS is not set (the address of a running sessionlog server)")
	}
	conn, err := grpc.Dial(target, grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return sessionlogv1.NewSessionLogServiceClient(conn), ctx
}

// errorInfo is the ErrorInfo detail of a failed call; the test fails when there is none.
func errorInfo(t *testing.T, err error, want codes.Code) *errdetails.ErrorInfo {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || err == nil {
		t.Fatalf("want a gRPC status %v, got %v", want, err)
	}
	if st.Code() != want {
		t.Fatalf("want code %v, got %v (%s)", want, st.Code(), st.Message())
	}
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	t.Fatalf("no ErrorInfo among the details %v", st.Details())
	return nil
}

func TestSeqConflictReportsNextSeq(t *testing.T) {
	client, ctx := dial(t)
	session := fmt.Sprintf("go-conflict-%d", time.Now().UnixNano())
	first := message(sessionlogv1.EventType_EVENT_TYPE_USER_MESSAGE, "first")
	if _, err := client.Append(ctx, &sessionlogv1.AppendRequest{SessionId: session, Events: []*sessionlogv1.Event{first}}); err != nil {
		t.Fatal(err)
	}
	stale := uint64(0)
	_, err := client.Append(ctx, &sessionlogv1.AppendRequest{
		SessionId:   session,
		ExpectedSeq: &stale,
		Events:      []*sessionlogv1.Event{message(sessionlogv1.EventType_EVENT_TYPE_USER_MESSAGE, "late")},
	})
	info := errorInfo(t, err, codes.Aborted)
	if info.Domain != "sessionlog" || info.Reason != "SEQ_CONFLICT" || info.Metadata["next_seq"] != "1" {
		t.Fatalf("want sessionlog/SEQ_CONFLICT with next_seq 1, got %v", info)
	}
}

func TestInvalidSessionIdIsRefused(t *testing.T) {
	client, ctx := dial(t)
	_, err := client.Append(ctx, &sessionlogv1.AppendRequest{
		SessionId: "no spaces allowed",
		Events:    []*sessionlogv1.Event{message(sessionlogv1.EventType_EVENT_TYPE_USER_MESSAGE, "hi")},
	})
	info := errorInfo(t, err, codes.InvalidArgument)
	if info.Domain != "sessionlog" || info.Reason != "INVALID_SESSION_ID" {
		t.Fatalf("want sessionlog/INVALID_SESSION_ID, got %v", info)
	}
}

// dialAt is dial for the address in the environment variable name (skips without it).
func dialAt(t *testing.T, name string) (sessionlogv1.SessionLogServiceClient, context.Context) {
	t.Helper()
	target := os.Getenv(name)
	if target == "" {
		t.Skipf("%s is not set", name)
	}
	conn, err := grpc.Dial(target, grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return sessionlogv1.NewSessionLogServiceClient(conn), ctx
}

// SESSIONLOG_TEST_SYNC_ADDRESS: a primary with --ack replica and no replica, so every write
// fails REPLICAS_UNAVAILABLE after its --sync-timeout, committed on the primary.
func TestReplicasUnavailableIsTyped(t *testing.T) {
	client, ctx := dialAt(t, "SESSIONLOG_TEST_SYNC_ADDRESS")
	session := fmt.Sprintf("go-sync-%d", time.Now().UnixNano())
	request := &sessionlogv1.AppendRequest{
		SessionId: session,
		RequestId: "go-r1",
		Events:    []*sessionlogv1.Event{message(sessionlogv1.EventType_EVENT_TYPE_USER_MESSAGE, "one")},
	}
	_, err := client.Append(ctx, request)
	var replicas *sessionlogerr.ReplicasUnavailableError
	if !errors.As(sessionlogerr.From(err), &replicas) {
		t.Fatalf("want *ReplicasUnavailableError, got %v", err)
	}
	if replicas.Needed != 1 || replicas.Counted != 0 || replicas.Position == 0 {
		t.Fatalf("want needed 1, counted 0 and a position, got %+v", replicas)
	}
	// Committed locally: the same request id again writes nothing more.
	_, err = client.Append(ctx, request)
	var again *sessionlogerr.ReplicasUnavailableError
	if !errors.As(sessionlogerr.From(err), &again) || again.Position != replicas.Position {
		t.Fatalf("want the retry refused at position %d again, got %v", replicas.Position, err)
	}
	got, err := client.GetSession(ctx, &sessionlogv1.GetSessionRequest{SessionId: session})
	if err != nil || got.Session.EventCount != 1 {
		t.Fatalf("want the write stored once on the primary, got %v, %v", got, err)
	}
}

// SESSIONLOG_TEST_REPLICA_ADDRESS: a replica; SESSIONLOG_TEST_PRIMARY_ADDRESS: its primary.
func TestNotPrimaryIsTyped(t *testing.T) {
	client, ctx := dialAt(t, "SESSIONLOG_TEST_REPLICA_ADDRESS")
	_, err := client.Append(ctx, &sessionlogv1.AppendRequest{
		SessionId: "go-replica",
		Events:    []*sessionlogv1.Event{message(sessionlogv1.EventType_EVENT_TYPE_USER_MESSAGE, "no")},
	})
	var notPrimary *sessionlogerr.NotPrimaryError
	if !errors.As(sessionlogerr.From(err), &notPrimary) {
		t.Fatalf("want *NotPrimaryError, got %v", err)
	}
	if notPrimary.Primary != os.Getenv("SESSIONLOG_TEST_PRIMARY_ADDRESS") || status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("want the hint %q, got %+v", os.Getenv("SESSIONLOG_TEST_PRIMARY_ADDRESS"), notPrimary)
	}
}
