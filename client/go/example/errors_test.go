package main

// Errors as a Go worker meets them: a gRPC status with one google.rpc.ErrorInfo detail (domain
// "sessionlog", a stable reason, metadata). The tests need a running server; they read its
// address from SESSIONLOG_TEST_ADDRESS (tests/e2e/test_client_go.py sets it) and skip without it.

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sessionlogv1 "github.com/sessionlog/sessionlog/client/go/sessionlog/v1"
)

func dial(t *testing.T) (sessionlogv1.SessionLogServiceClient, context.Context) {
	t.Helper()
	target := os.Getenv("SESSIONLOG_TEST_ADDRESS")
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
