// Package sessionheader sends the session id of each call in the x-session-id metadata, so that a
// proxy (HAProxy in front of sharded groups) can route the call to the session's group without
// reading the protobuf body.
//
// Install both interceptors when dialing:
//
//	conn, err := grpc.Dial(target, append(sessionheader.DialOptions(), grpc.WithInsecure())...)
//
// Every request that names a session gets the header: its session_id, for ForkSession the
// source (parent_session_id, also a sub-agent CreateSession's parent), for UpdateSession
// session.session_id. ListSessions and the other services' requests name none and are
// left alone, as is metadata the caller set (a token, or an x-session-id of its own).
package sessionheader

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	sessionlogv1 "github.com/sessionlog/sessionlog/client/go/sessionlog/v1"
)

// Key is the metadata key that names a call's session.
const Key = "x-session-id"

// Value is the header value of a session id: the id itself when it is plain ASCII (every id of
// A-Za-z0-9_.-), else its UTF-8 bytes percent-encoded, as gRPC metadata values are printable
// ASCII only. Session ids never hold '%', so the plain form is never ambiguous.
func Value(sessionID string) string {
	const hex = "0123456789ABCDEF"
	out := make([]byte, 0, len(sessionID))
	for i := 0; i < len(sessionID); i++ {
		b := sessionID[i]
		if 'A' <= b && b <= 'Z' || 'a' <= b && b <= 'z' || '0' <= b && b <= '9' ||
			b == '_' || b == '.' || b == '-' || b == '~' {
			out = append(out, b)
		} else {
			out = append(out, '%', hex[b>>4], hex[b&15])
		}
	}
	return string(out)
}

// SessionOf is the session a request names: a fork's source (or a sub-agent child's parent, in
// the same group), an UpdateSession's session, else its session id; "" for none.
func SessionOf(request interface{}) string {
	if fork, ok := request.(interface{ GetParentSessionId() string }); ok && fork.GetParentSessionId() != "" {
		return fork.GetParentSessionId()
	}
	if update, ok := request.(interface {
		GetSession() *sessionlogv1.Session
	}); ok {
		return update.GetSession().GetSessionId()
	}
	if named, ok := request.(interface{ GetSessionId() string }); ok {
		return named.GetSessionId()
	}
	return ""
}

// WithSession adds x-session-id for request to ctx, unless request names no session or ctx
// carries the header already.
func WithSession(ctx context.Context, request interface{}) context.Context {
	id := SessionOf(request)
	if id == "" {
		return ctx
	}
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(Key)) > 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, Key, Value(id))
}

// UnaryClientInterceptor adds x-session-id to every unary call that names a session.
func UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(WithSession(ctx, req), method, req, reply, cc, opts...)
	}
}

// StreamClientInterceptor adds x-session-id to every server-streaming call (Since) that names a
// session. Headers leave when a stream opens, before its request is known, so such a stream
// opens at its request's SendMsg (which the generated client calls at once). Client-streaming
// calls pass through unchanged.
func StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
		streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if desc.ClientStreams {
			return streamer(ctx, desc, cc, method, opts...)
		}
		return &lazyStream{ctx: ctx, desc: desc, cc: cc, method: method, streamer: streamer, opts: opts}, nil
	}
}

// DialOptions are the two interceptors as dial options (chained after any others).
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(StreamClientInterceptor()),
	}
}

var errNotOpen = errors.New("sessionheader: the stream opens with its request (SendMsg first)")

type lazyStream struct {
	ctx      context.Context
	desc     *grpc.StreamDesc
	cc       *grpc.ClientConn
	method   string
	streamer grpc.Streamer
	opts     []grpc.CallOption
	stream   grpc.ClientStream
}

func (s *lazyStream) SendMsg(m interface{}) error {
	if s.stream == nil {
		stream, err := s.streamer(WithSession(s.ctx, m), s.desc, s.cc, s.method, s.opts...)
		if err != nil {
			return err
		}
		s.stream = stream
	}
	return s.stream.SendMsg(m)
}

func (s *lazyStream) RecvMsg(m interface{}) error {
	if s.stream == nil {
		return errNotOpen
	}
	return s.stream.RecvMsg(m)
}

func (s *lazyStream) Header() (metadata.MD, error) {
	if s.stream == nil {
		return nil, errNotOpen
	}
	return s.stream.Header()
}

func (s *lazyStream) Trailer() metadata.MD {
	if s.stream == nil {
		return nil
	}
	return s.stream.Trailer()
}

func (s *lazyStream) CloseSend() error {
	if s.stream == nil {
		return errNotOpen
	}
	return s.stream.CloseSend()
}

func (s *lazyStream) Context() context.Context {
	if s.stream == nil {
		return s.ctx
	}
	return s.stream.Context()
}
