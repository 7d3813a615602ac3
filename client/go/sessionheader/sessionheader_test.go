package sessionheader_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sessionlog/sessionlog/client/go/sessionheader"
	sessionlogv1 "github.com/sessionlog/sessionlog/client/go/sessionlog/v1"
)

type call struct {
	method string
	md     metadata.MD
}

// recorder is a real gRPC server that records every call's method and metadata, then refuses it.
type recorder struct {
	mu    sync.Mutex
	calls []call
}

func (r *recorder) handle(_ interface{}, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	md, _ := metadata.FromIncomingContext(stream.Context())
	r.mu.Lock()
	r.calls = append(r.calls, call{method[strings.LastIndex(method, "/")+1:], md})
	r.mu.Unlock()
	return status.Error(codes.Unimplemented, "recorded")
}

func TestEveryCallNamingASessionCarriesTheHeader(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	server := grpc.NewServer(grpc.UnknownServiceHandler(rec.handle))
	go server.Serve(listener)
	defer server.Stop()

	opts := append(sessionheader.DialOptions(), grpc.WithInsecure())
	conn, err := grpc.Dial(listener.Addr().String(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := sessionlogv1.NewSessionLogServiceClient(conn)
	base, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx := metadata.AppendToOutgoingContext(base, "authorization", "Bearer secret")

	const sid, source = "sess-1", "parent.2"
	type step struct {
		method, session string
		run             func() error
	}
	steps := []step{
		{"Append", sid, func() error {
			_, err := client.Append(ctx, &sessionlogv1.AppendRequest{SessionId: sid})
			return err
		}},
		{"Since", sid, func() error {
			stream, err := client.Since(ctx, &sessionlogv1.SinceRequest{SessionId: sid, Follow: true})
			if err != nil {
				return err
			}
			_, err = stream.Recv()
			return err
		}},
		{"Surface", sid, func() error {
			_, err := client.Surface(ctx, &sessionlogv1.SurfaceRequest{SessionId: sid})
			return err
		}},
		{"DeriveMessages", sid, func() error {
			_, err := client.DeriveMessages(ctx, &sessionlogv1.DeriveMessagesRequest{SessionId: sid})
			return err
		}},
		{"CreateSession", sid, func() error {
			_, err := client.CreateSession(ctx, &sessionlogv1.CreateSessionRequest{SessionId: sid})
			return err
		}},
		{"SeedSession", sid, func() error {
			_, err := client.SeedSession(ctx, &sessionlogv1.SeedSessionRequest{SessionId: sid})
			return err
		}},
		{"GetSession", sid, func() error {
			_, err := client.GetSession(ctx, &sessionlogv1.GetSessionRequest{SessionId: sid})
			return err
		}},
		{"ForkSession", source, func() error {
			_, err := client.ForkSession(ctx, &sessionlogv1.ForkSessionRequest{ParentSessionId: source, SessionId: "child"})
			return err
		}},
		{"AcquireLease", sid, func() error {
			_, err := client.AcquireLease(ctx, &sessionlogv1.AcquireLeaseRequest{SessionId: sid, Holder: "w1"})
			return err
		}},
		{"RenewLease", sid, func() error {
			_, err := client.RenewLease(ctx, &sessionlogv1.RenewLeaseRequest{SessionId: sid, Holder: "w1"})
			return err
		}},
		{"ReleaseLease", sid, func() error {
			_, err := client.ReleaseLease(ctx, &sessionlogv1.ReleaseLeaseRequest{SessionId: sid, Holder: "w1"})
			return err
		}},
		{"UpdateSession", sid, func() error {
			_, err := client.UpdateSession(ctx, &sessionlogv1.UpdateSessionRequest{Session: &sessionlogv1.Session{SessionId: sid}})
			return err
		}},
		{"CreateSession", source, func() error {
			_, err := client.CreateSession(ctx, &sessionlogv1.CreateSessionRequest{SessionId: "kid", ParentSessionId: source})
			return err
		}},
		{"ListSessions", "", func() error {
			_, err := client.ListSessions(ctx, &sessionlogv1.ListSessionsRequest{Prefix: "s"})
			return err
		}},
		{"GetSession", "%C5%BC%C3%B3%C5%82w", func() error {
			_, err := client.GetSession(ctx, &sessionlogv1.GetSessionRequest{SessionId: "żółw"})
			return err
		}},
	}
	for _, s := range steps {
		if code := status.Code(s.run()); code != codes.Unimplemented {
			t.Fatalf("%s: got %v, want Unimplemented from the recorder", s.method, code)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.calls) != len(steps) {
		t.Fatalf("the server saw %d calls, want %d", len(rec.calls), len(steps))
	}
	for i, s := range steps {
		got := rec.calls[i]
		if got.method != s.method {
			t.Errorf("call %d: method %s, want %s", i, got.method, s.method)
		}
		want := []string{}
		if s.session != "" {
			want = []string{s.session}
		}
		if header := got.md.Get(sessionheader.Key); strings.Join(header, "|") != strings.Join(want, "|") {
			t.Errorf("%s: x-session-id %q, want %q", s.method, header, want)
		}
		if auth := got.md.Get("authorization"); len(auth) != 1 || auth[0] != "Bearer secret" {
			t.Errorf("%s: authorization %q, want the caller's token kept", s.method, auth)
		}
	}
}

func TestAHeaderTheCallerSetIsKept(t *testing.T) {
	ctx := metadata.AppendToOutgoingContext(context.Background(), sessionheader.Key, "mine")
	ctx = sessionheader.WithSession(ctx, &sessionlogv1.GetSessionRequest{SessionId: "other"})
	md, _ := metadata.FromOutgoingContext(ctx)
	if got := md.Get(sessionheader.Key); len(got) != 1 || got[0] != "mine" {
		t.Fatalf("x-session-id %q, want only the caller's", got)
	}
	if v := sessionheader.Value("Abc_9.x-y"); v != "Abc_9.x-y" {
		t.Fatalf("a plain id is sent as it is, got %q", v)
	}
}
