// Package jstest starts a real embedded NATS JetStream server for tests (test/testkit polls for conditions).
package jstest

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/faas-gpu/faas-gpu/queueworker/natsserver"
)

// Test credentials of the servers this package starts (the embedded server always requires some).
const (
	User     = "faas-gpu-test"
	Password = "test-password"
)

// Config returns the configuration Server uses: a free port, the store in dir, the test credentials.
func Config(dir string) natsserver.Config {
	return natsserver.Config{StoreDir: dir, Port: -1, Username: User, Password: Password}
}

// Server starts an embedded JetStream server on a free port with its store in a temporary directory and the test
// credentials; it is shut down when the test ends.
func Server(t testing.TB) *natsserver.Server {
	t.Helper()
	s, err := natsserver.Start(context.Background(), Config(t.TempDir()))
	if err != nil {
		t.Fatalf("starting NATS: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// AuthURL is url with the test credentials in it (nats.go takes them from the URL).
func AuthURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.User = url.UserPassword(User, Password)
	return u.String()
}

// Connect connects to url with the test credentials and endless reconnects and returns a JetStream handle; the
// connection is closed when the test ends.
func Connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(User, Password), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
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
