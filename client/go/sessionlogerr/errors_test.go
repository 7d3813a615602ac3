package sessionlogerr

// From over statuses built the way a sessionlog server builds them (one ErrorInfo detail,
// domain "sessionlog"); example/errors_test.go meets the same errors from a real server.

import (
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func refusal(t *testing.T, code codes.Code, reason string, metadata map[string]string) error {
	t.Helper()
	st, err := status.New(code, "refused").WithDetails(
		&errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: metadata},
	)
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

func TestReplicasUnavailableCarriesItsCounts(t *testing.T) {
	raw := refusal(t, codes.Unavailable, ReasonReplicasUnavailable,
		map[string]string{"needed": "2", "counted": "1", "position": "41"})
	var replicas *ReplicasUnavailableError
	if !errors.As(From(raw), &replicas) {
		t.Fatalf("want *ReplicasUnavailableError, got %T", From(raw))
	}
	if replicas.Needed != 2 || replicas.Counted != 1 || replicas.Position != 41 {
		t.Fatalf("want needed 2, counted 1, position 41; got %+v", replicas)
	}
	var base *ServerError
	if !errors.As(From(raw), &base) || base.Reason != ReasonReplicasUnavailable {
		t.Fatalf("want it to unwrap to a *ServerError with its reason, got %v", base)
	}
	if status.Code(From(raw)) != codes.Unavailable || !errors.Is(From(raw), raw) {
		t.Fatal("want the original status and error behind it")
	}
}

func TestNotPrimaryAndLeadershipLostAreTyped(t *testing.T) {
	var notPrimary *NotPrimaryError
	raw := refusal(t, codes.FailedPrecondition, ReasonNotPrimary,
		map[string]string{"primary": "10.0.0.2:50051", "epoch": "3"})
	if !errors.As(From(raw), &notPrimary) || notPrimary.Primary != "10.0.0.2:50051" || notPrimary.Epoch != 3 {
		t.Fatalf("want NOT_PRIMARY naming 10.0.0.2:50051 at epoch 3, got %v", From(raw))
	}
	var lost *LeadershipLostError
	raw = refusal(t, codes.Unavailable, ReasonLeadershipLost, map[string]string{"committed": "True"})
	if !errors.As(From(raw), &lost) || !lost.Committed {
		t.Fatalf("want LEADERSHIP_LOST, committed, got %v", From(raw))
	}
}

func TestOtherErrorsPassThroughOrStayGeneric(t *testing.T) {
	if From(nil) != nil {
		t.Fatal("want nil for nil")
	}
	transport := status.Error(codes.Unavailable, "connection refused")
	if From(transport) != transport {
		t.Fatal("want a status without ErrorInfo unchanged")
	}
	plain := errors.New("not a status")
	if From(plain) != plain {
		t.Fatal("want a non-status error unchanged")
	}
	raw := refusal(t, codes.Aborted, "SEQ_CONFLICT", map[string]string{"next_seq": "4"})
	base, ok := From(raw).(*ServerError)
	if !ok || base.Reason != "SEQ_CONFLICT" || base.Metadata["next_seq"] != "4" || base.Code != codes.Aborted {
		t.Fatalf("want a *ServerError SEQ_CONFLICT with next_seq 4, got %#v", From(raw))
	}
}

func TestWrongGroupNamesTheOwner(t *testing.T) {
	raw := refusal(t, codes.FailedPrecondition, ReasonWrongGroup, map[string]string{
		"session_id": "s1", "slot": "1000", "group": "g2", "primary": "10.0.1.1:50051",
		"members": "10.0.1.1:50051,10.0.1.2:50051", "map_epoch": "4",
	})
	var wrong *WrongGroupError
	if !errors.As(From(raw), &wrong) {
		t.Fatalf("want *WrongGroupError, got %T", From(raw))
	}
	if wrong.Group != "g2" || wrong.Primary != "10.0.1.1:50051" || len(wrong.Members) != 2 ||
		wrong.Slot != 1000 || wrong.MapEpoch != 4 {
		t.Fatalf("want the owner g2 and its members, got %+v", wrong)
	}
}
