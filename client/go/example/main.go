// Command example appends two messages to a session and prints the derived messages.
//
//	go run ./example 127.0.0.1:50051
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sessionlog/sessionlog/client/go/sessionheader"
	sessionlogv1 "github.com/sessionlog/sessionlog/client/go/sessionlog/v1"
)

func message(kind sessionlogv1.EventType, content string) *sessionlogv1.Event {
	data, err := structpb.NewStruct(map[string]interface{}{"content": content})
	if err != nil {
		log.Fatal(err)
	}
	return &sessionlogv1.Event{Type: kind, Data: data}
}

func main() {
	target := "127.0.0.1:50051"
	if len(os.Args) > 1 {
		target = os.Args[1]
	}
	// sessionheader names each call's session in x-session-id, for a proxy routing on it.
	conn, err := grpc.Dial(target, append(sessionheader.DialOptions(), grpc.WithInsecure())...)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := sessionlogv1.NewSessionLogServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	_, err = client.Append(ctx, &sessionlogv1.AppendRequest{
		SessionId: "hello-go",
		Events: []*sessionlogv1.Event{
			message(sessionlogv1.EventType_EVENT_TYPE_USER_MESSAGE, "What is LMDB?"),
			message(sessionlogv1.EventType_EVENT_TYPE_ASSISTANT_MESSAGE, "A memory-mapped B+tree store."),
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	reply, err := client.DeriveMessages(ctx, &sessionlogv1.DeriveMessagesRequest{SessionId: "hello-go"})
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range reply.Messages {
		fmt.Println(m.Role, m.GetContent())
	}
}
