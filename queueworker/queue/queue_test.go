package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/faas-gpu/faas-gpu/queueworker/internal/jstest"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"faas-request", "slow_queue", "Q1"} {
		if err := queue.ValidateName(ok); err != nil {
			t.Errorf("ValidateName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a.b", "a b", "a*", "a>", string(make([]byte, 65))} {
		if err := queue.ValidateName(bad); !errors.Is(err, queue.ErrInvalidName) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalidName", bad, err)
		}
	}
}

// Ensure creates work-queue streams (idempotently) and the dead-letter stream; States reports backlog and
// consumers.
func TestEnsureAndStates(t *testing.T) {
	ctx := context.Background()
	s := jstest.Server(t)
	_, js := jstest.Connect(t, s.ClientURL())
	for range 2 {
		if err := queue.Ensure(ctx, js, queue.DefaultQueue, "batch"); err != nil {
			t.Fatal(err)
		}
	}
	st, err := js.Stream(ctx, "OF_faas-request")
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.Retention != jetstream.WorkQueuePolicy || c.Storage != jetstream.FileStorage || c.Subjects[0] != "faas-request" {
		t.Fatalf("stream config %+v", c)
	}
	if err := queue.Ensure(ctx, js, "bad.name"); !errors.Is(err, queue.ErrInvalidName) {
		t.Fatalf("Ensure(bad.name) = %v", err)
	}
	for range 3 {
		if _, err := js.Publish(ctx, "batch", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: queue.DeadLetterSubject("batch"), Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, "OF_batch", jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Next(jetstream.FetchMaxWait(5 * time.Second)); err != nil { // held, not acked
		t.Fatal(err)
	}
	states, dead, err := queue.States(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if dead != 1 || len(states) != 2 || states[0].Queue != "batch" || states[1].Queue != "faas-request" {
		t.Fatalf("states %+v, dead %d", states, dead)
	}
	if b := states[0]; b.Messages != 3 || b.Pending != 2 || b.AckPending != 1 || b.Consumers != 1 {
		t.Fatalf("batch state %+v", b)
	}
}

// An existing stream keeps the operator's settings.
func TestEnsureKeepsExistingStream(t *testing.T) {
	ctx := context.Background()
	s := jstest.Server(t)
	_, js := jstest.Connect(t, s.ClientURL())
	cfg := queue.StreamConfig("tuned")
	cfg.MaxMsgs = 123
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := queue.Ensure(ctx, js, "tuned"); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "OF_tuned")
	if err != nil {
		t.Fatal(err)
	}
	if st.CachedInfo().Config.MaxMsgs != 123 {
		t.Fatalf("Ensure changed the existing stream: %+v", st.CachedInfo().Config)
	}
}

func TestValidateFunctionName(t *testing.T) {
	for _, ok := range []string{"echo", "hello-gpu", "fn.openfaas-fn", "A_1"} {
		if err := queue.ValidateFunctionName(ok); err != nil {
			t.Errorf("ValidateFunctionName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a..b", ".a", "a.", "a/b", "a?b", "a b", string(make([]byte, 254))} {
		if err := queue.ValidateFunctionName(bad); !errors.Is(err, queue.ErrInvalidFunctionName) {
			t.Errorf("ValidateFunctionName(%q) = %v, want ErrInvalidFunctionName", bad, err)
		}
	}
}
