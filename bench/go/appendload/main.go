// Command appendload is the bench's compiled load client for appends: N AppendStream streams,
// each pipelining up to W appends to its own session, or N unary Append callers, one call in
// flight each. It prints one JSON line: appends and events per second, p50/p99 per append,
// errors, and what each session was acknowledged.
//
//	appendload -addr 127.0.0.1:50051 -mode stream -streams 16 -window 16 -events 1 -duration 5s
//
// Each stream or caller has a connection of its own (as each h2load client has), so a server of
// several workers gets them spread by the kernel. The clock starts once every connection is up
// and stops at -duration or after -count appends per stream, whichever comes first; appends in
// flight then are still answered and counted (the rate is over the time to the last answer).
// A per-request error (AppendStreamResponse.error, or a unary call's status) is counted, the
// first one is reported, and the load goes on; a broken stream ends its client with an error.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	sessionlogv1 "github.com/sessionlog/sessionlog/client/go/sessionlog/v1"
	"github.com/sessionlog/sessionlog/client/go/sessionlogerr"
)

// content is the bench's event content (bench/common.py's CONTENT): a small user message.
const content = "hello world, this is a message of moderate length"

type options struct {
	addr     string
	mode     string
	clients  int
	window   int
	events   int
	duration time.Duration
	count    int
	prefix   string
	request  string
	timeout  time.Duration
}

// outcome is what one stream or caller did.
type outcome struct {
	latencies []time.Duration
	acked     int // appends answered with a result
	events    int // events acknowledged
	errors    int
	first     string
	last      time.Time
}

func (o *outcome) fail(format string, args ...interface{}) {
	o.errors++
	if o.first == "" {
		o.first = fmt.Sprintf(format, args...)
	}
}

// report is the JSON line printed at the end.
type report struct {
	Mode             string  `json:"mode"`
	Clients          int     `json:"clients"`
	Window           int     `json:"window"`
	EventsPerAppend  int     `json:"events_per_append"`
	Seconds          float64 `json:"seconds"`
	Appends          int     `json:"appends"`
	Events           int     `json:"events"`
	AppendsPerSecond float64 `json:"appends_per_second"`
	EventsPerSecond  float64 `json:"events_per_second"`
	P50Ms            float64 `json:"p50_ms"`
	P99Ms            float64 `json:"p99_ms"`
	MaxMs            float64 `json:"max_ms"`
	Errors           int     `json:"errors"`
	FirstError       string  `json:"first_error"`
	AckedEvents      []int   `json:"acked_events_per_client"`
	ClientCPUSeconds float64 `json:"client_cpu_seconds"`
}

func main() {
	var o options
	flag.StringVar(&o.addr, "addr", "127.0.0.1:50051", "the server's host:port")
	flag.StringVar(&o.mode, "mode", "stream", "stream (AppendStream, pipelined) or unary (Append)")
	flag.IntVar(&o.clients, "streams", 16, "streams (or unary callers), each to its own session")
	flag.IntVar(&o.window, "window", 16, "appends in flight per stream (stream mode)")
	flag.IntVar(&o.events, "events", 1, "events per append")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "how long to send (0: until -count)")
	flag.IntVar(&o.count, "count", 0, "at most this many appends per stream (0: no bound)")
	flag.StringVar(&o.prefix, "prefix", "appendload", "session ids are PREFIX-<index>")
	flag.StringVar(&o.request, "request", "", "a serialized AppendRequest whose events to send "+
		"(default: -events copies of the bench's user message)")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Second, "a unary call's deadline")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "appendload:", err)
		os.Exit(2)
	}
}

func run(o options) error {
	if o.mode != "stream" && o.mode != "unary" {
		return fmt.Errorf("-mode must be stream or unary, not %q", o.mode)
	}
	if o.clients < 1 || o.window < 1 || o.events < 0 {
		return fmt.Errorf("-streams and -window must be at least 1, -events at least 0")
	}
	if o.duration <= 0 && o.count <= 0 {
		return fmt.Errorf("give a -duration, a -count, or both")
	}
	events, err := loadEvents(o)
	if err != nil {
		return err
	}
	conns := make([]*grpc.ClientConn, o.clients)
	for i := range conns {
		conn, err := grpc.Dial(o.addr, grpc.WithInsecure(), grpc.WithBlock())
		if err != nil {
			return fmt.Errorf("dial %s: %w", o.addr, err)
		}
		defer conn.Close()
		conns[i] = conn
	}
	outcomes := make([]outcome, o.clients)
	start := time.Now()
	deadline := start.Add(o.duration)
	if o.duration <= 0 {
		deadline = start.Add(100 * 365 * 24 * time.Hour) // bounded by -count alone
	}
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			client := sessionlogv1.NewSessionLogServiceClient(conns[i])
			request := &sessionlogv1.AppendRequest{
				SessionId: fmt.Sprintf("%s-%d", o.prefix, i),
				Events:    events,
			}
			if o.mode == "stream" {
				streamLoad(client, request, o, deadline, &outcomes[i])
			} else {
				unaryLoad(client, request, o, deadline, &outcomes[i])
			}
		}(i)
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(summarize(o, start, outcomes))
}

func loadEvents(o options) ([]*sessionlogv1.Event, error) {
	if o.request != "" {
		raw, err := os.ReadFile(o.request)
		if err != nil {
			return nil, err
		}
		var template sessionlogv1.AppendRequest
		if err := proto.Unmarshal(raw, &template); err != nil {
			return nil, fmt.Errorf("%s is not an AppendRequest: %w", o.request, err)
		}
		return template.Events, nil
	}
	data, err := structpb.NewStruct(map[string]interface{}{"content": content})
	if err != nil {
		return nil, err
	}
	event := &sessionlogv1.Event{Type: sessionlogv1.EventType_EVENT_TYPE_USER_MESSAGE, Data: data}
	events := make([]*sessionlogv1.Event, o.events)
	for i := range events {
		events[i] = event
	}
	return events, nil
}

// streamLoad sends appends over one AppendStream, at most o.window unanswered, until the
// deadline or the count; then half-closes and reads every answer to the end of the stream.
func streamLoad(
	client sessionlogv1.SessionLogServiceClient,
	append_ *sessionlogv1.AppendRequest,
	o options,
	deadline time.Time,
	out *outcome,
) {
	stream, err := client.AppendStream(context.Background())
	if err != nil {
		out.fail("opening AppendStream: %v", err)
		return
	}
	slots := make(chan struct{}, o.window)
	var mu sync.Mutex
	sent := map[uint64]time.Time{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			reply, err := stream.Recv()
			now := time.Now()
			if err == io.EOF {
				return
			}
			if err != nil {
				mu.Lock()
				out.fail("stream ended: %v", err)
				mu.Unlock()
				return
			}
			mu.Lock()
			at, known := sent[reply.CorrelationId]
			delete(sent, reply.CorrelationId)
			switch {
			case !known:
				out.fail("an answer to correlation_id %d, never sent or answered twice",
					reply.CorrelationId)
			case reply.GetError() != nil:
				e := reply.GetError()
				out.fail("%s (code %d): %s", e.Reason, e.Code, e.Message)
			case reply.GetAppend() == nil:
				out.fail("correlation_id %d answered with neither a result nor an error",
					reply.CorrelationId)
			default:
				out.acked++
				out.events += len(append_.Events)
				out.latencies = append(out.latencies, now.Sub(at))
				out.last = now
			}
			mu.Unlock()
			<-slots
		}
	}()
send:
	for id := uint64(1); o.count == 0 || int(id) <= o.count; id++ {
		select {
		case slots <- struct{}{}:
		case <-done:
			break send // the stream ended: what it left unanswered is counted below
		}
		if time.Now().After(deadline) {
			break
		}
		mu.Lock()
		sent[id] = time.Now()
		mu.Unlock()
		request := &sessionlogv1.AppendStreamRequest{Append: append_, CorrelationId: id}
		if err := stream.Send(request); err != nil {
			break // Recv reports why the stream ended
		}
	}
	if err := stream.CloseSend(); err != nil {
		mu.Lock()
		out.fail("half-closing the stream: %v", err)
		mu.Unlock()
	}
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(sent) > 0 && out.errors == 0 {
		out.fail("%d appends never answered", len(sent))
	}
}

// unaryLoad calls Append one at a time until the deadline or the count.
func unaryLoad(
	client sessionlogv1.SessionLogServiceClient,
	request *sessionlogv1.AppendRequest,
	o options,
	deadline time.Time,
	out *outcome,
) {
	for n := 0; o.count == 0 || n < o.count; n++ {
		at := time.Now()
		if at.After(deadline) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
		_, err := client.Append(ctx, request)
		cancel()
		now := time.Now()
		if err != nil {
			out.fail("Append: %v", sessionlogerr.From(err))
			if out.errors >= 100 {
				return
			}
			continue
		}
		out.acked++
		out.events += len(request.Events)
		out.latencies = append(out.latencies, now.Sub(at))
		out.last = now
	}
}

func summarize(o options, start time.Time, outcomes []outcome) report {
	r := report{
		Mode:            o.mode,
		Clients:         o.clients,
		Window:          o.window,
		EventsPerAppend: o.events,
		AckedEvents:     make([]int, len(outcomes)),
	}
	if o.mode == "unary" {
		r.Window = 1
	}
	end := start
	var latencies []time.Duration
	for i, out := range outcomes {
		r.Appends += out.acked
		r.Events += out.events
		r.Errors += out.errors
		if r.FirstError == "" && out.first != "" {
			r.FirstError = fmt.Sprintf("client %d: %s", i, out.first)
		}
		r.AckedEvents[i] = out.events
		latencies = append(latencies, out.latencies...)
		if out.last.After(end) {
			end = out.last
		}
	}
	r.Seconds = end.Sub(start).Seconds()
	if r.Seconds > 0 {
		r.AppendsPerSecond = float64(r.Appends) / r.Seconds
		r.EventsPerSecond = float64(r.Events) / r.Seconds
	}
	sort.Slice(latencies, func(a, b int) bool { return latencies[a] < latencies[b] })
	r.P50Ms = milliseconds(percentile(latencies, 0.50))
	r.P99Ms = milliseconds(percentile(latencies, 0.99))
	if len(latencies) > 0 {
		r.MaxMs = milliseconds(latencies[len(latencies)-1])
	}
	var usage syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &usage) == nil {
		r.ClientCPUSeconds = seconds(usage.Utime) + seconds(usage.Stime)
	}
	return r
}

// percentile is the nearest-rank value below which fraction of the sorted values fall.
func percentile(sorted []time.Duration, fraction float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(fraction*float64(len(sorted))+0.5) - 1
	if rank < 0 {
		rank = 0
	}
	if rank >= len(sorted) {
		rank = len(sorted) - 1
	}
	return sorted[rank]
}

func milliseconds(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func seconds(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
