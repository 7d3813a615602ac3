package main

// State, hides and the lease audit through the generated stubs alone: Event.state_delta and
// GetState, an EVENT_TYPE_HIDE with its range, and AdminService.ListLeaseAudit. Like the error
// tests, they need SESSIONLOG_TEST_ADDRESS (tests/e2e/test_client_go.py sets it).

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	sessionlogv1 "github.com/sessionlog/sessionlog/client/go/sessionlog/v1"
)

func withDelta(event *sessionlogv1.Event, delta map[string]interface{}) *sessionlogv1.Event {
	state, err := structpb.NewStruct(delta)
	if err != nil {
		panic(err)
	}
	event.StateDelta = state
	return event
}

func TestStateAndHide(t *testing.T) {
	client, ctx := dial(t)
	session := fmt.Sprintf("go-state-%d", time.Now().UnixNano())
	user := sessionlogv1.EventType_EVENT_TYPE_USER_MESSAGE
	hide := &sessionlogv1.Event{
		Type: sessionlogv1.EventType_EVENT_TYPE_HIDE,
		SurfaceOp: &sessionlogv1.SurfaceOp{Kind: &sessionlogv1.SurfaceOp_Replace_{
			Replace: &sessionlogv1.SurfaceOp_Replace{StartSeq: 1, StopSeq: 1},
		}},
	}
	events := []*sessionlogv1.Event{
		withDelta(message(user, "one"), map[string]interface{}{"user": "ann", "step": 1}),
		message(user, "two"),
		withDelta(hide, map[string]interface{}{"user": nil, "step": 2}),
	}
	if _, err := client.Append(ctx, &sessionlogv1.AppendRequest{SessionId: session, Events: events}); err != nil {
		t.Fatal(err)
	}
	state, err := client.GetState(ctx, &sessionlogv1.GetStateRequest{SessionId: session})
	if err != nil {
		t.Fatal(err)
	}
	if got := state.GetState().AsMap(); len(got) != 1 || got["step"] != 2.0 || state.GetEventCount() != 3 {
		t.Fatalf("want {step: 2} after 3 events, got %v after %d", got, state.GetEventCount())
	}
	first := uint64(0)
	early, err := client.GetState(ctx, &sessionlogv1.GetStateRequest{SessionId: session, AtSeq: &first})
	if err != nil {
		t.Fatal(err)
	}
	if got := early.GetState().AsMap(); got["user"] != "ann" || early.GetEventCount() != 1 {
		t.Fatalf("want user ann at seq 0, got %v", got)
	}
	derived, err := client.DeriveMessages(ctx, &sessionlogv1.DeriveMessagesRequest{SessionId: session})
	if err != nil {
		t.Fatal(err)
	}
	if len(derived.GetMessages()) != 1 || derived.GetMessages()[0].GetContent() != "one" {
		t.Fatalf("want only \"one\" left after hiding seq 1, got %v", derived.GetMessages())
	}
}

func TestLeaseAuditListsTakeovers(t *testing.T) {
	client, ctx := dial(t)
	session := fmt.Sprintf("go-audit-%d", time.Now().UnixNano())
	brief := &sessionlogv1.AcquireLeaseRequest{SessionId: session, Holder: "old", Ttl: durationpb.New(time.Millisecond)}
	if _, err := client.AcquireLease(ctx, brief); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	takeover := &sessionlogv1.AcquireLeaseRequest{SessionId: session, Holder: "new", Ttl: durationpb.New(time.Minute)}
	if _, err := client.AcquireLease(ctx, takeover); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.Dial(testAddress(), grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	admin := sessionlogv1.NewAdminServiceClient(conn)
	reply, err := admin.ListLeaseAudit(ctx, &sessionlogv1.ListLeaseAuditRequest{Prefix: session})
	if err != nil {
		t.Fatal(err)
	}
	entries := reply.GetEntries()
	if len(entries) != 1 || entries[0].GetSessionId() != session || entries[0].GetIndex() != 0 {
		t.Fatalf("want one entry of %s, got %v", session, entries)
	}
	entry := entries[0].GetEntry()
	if entry.GetKind() != sessionlogv1.LeaseAuditKind_LEASE_AUDIT_KIND_TAKEOVER || entry.GetActor() != "new" || entry.GetPreviousHolder() != "old" {
		t.Fatalf("want a takeover by new from old, got %v", entry)
	}
}
