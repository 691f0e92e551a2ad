// Package jstest starts a real embedded NATS JetStream server for tests and polls for conditions.
package jstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/faas-gpu/faas-gpu/queueworker/natsserver"
)

// Server starts an embedded JetStream server on a free port with its store in a temporary directory; it is shut
// down when the test ends.
func Server(t testing.TB) *natsserver.Server {
	t.Helper()
	s, err := natsserver.Start(context.Background(), natsserver.Config{StoreDir: t.TempDir(), Port: -1})
	if err != nil {
		t.Fatalf("starting NATS: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// Connect connects to url with endless reconnects and returns a JetStream handle; the connection is closed when
// the test ends.
func Connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatalf("connecting to NATS: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// Eventually polls cond every 10ms until it holds or timeout passes, then fails the test with msg.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: "+msg, append([]any{timeout}, args...)...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
