package natsserver_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/faas-gpu/faas-gpu/queueworker/natsserver"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

func TestStartRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]natsserver.Config{
		"no store":    {Port: -1, Username: "u", Password: "p"},
		"port 0":      {StoreDir: t.TempDir(), Port: 0, Username: "u", Password: "p"},
		"port high":   {StoreDir: t.TempDir(), Port: 70000, Username: "u", Password: "p"},
		"no user":     {StoreDir: t.TempDir(), Port: -1, Password: "p"},
		"no password": {StoreDir: t.TempDir(), Port: -1, Username: "u"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := natsserver.Start(context.Background(), cfg); !errors.Is(err, natsserver.ErrInvalidConfig) {
				t.Fatalf("Start(%+v) = %v, want ErrInvalidConfig", cfg, err)
			}
		})
	}
}

// A server restarted on the same store directory and port keeps a stream's messages.
func TestRestartKeepsMessages(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := natsserver.Start(ctx, natsserver.Config{StoreDir: dir, Port: -1, Username: "u", Password: "p"})
	if err != nil {
		t.Fatal(err)
	}
	port := s.Port()
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("u", "p"), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if _, err := js.Publish(ctx, "t", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	s.Shutdown()

	s2, err := natsserver.Start(ctx, natsserver.Config{StoreDir: dir, Port: port, Username: "u", Password: "p"})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Shutdown()
	if s2.Port() != port {
		t.Fatalf("restarted on port %d, want %d", s2.Port(), port)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := js.Stream(ctx, "T")
		if err == nil && st.CachedInfo().State.Msgs == 10 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream after restart: %v (want 10 messages)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The server takes no client without the credentials, and carries the messages the queue needs
// (queue.MaxMessageBytes).
func TestRequiresCredentialsAndCarriesTheQueueLimit(t *testing.T) {
	password := natsserver.RandomPassword()
	if len(password) != 64 || password == natsserver.RandomPassword() {
		t.Fatalf("RandomPassword %q: want 64 hex digits, different each time", password)
	}
	s, err := natsserver.Start(context.Background(), natsserver.Config{StoreDir: t.TempDir(), Port: -1,
		Username: "faas-gpu", Password: password})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	for name, opts := range map[string][]nats.Option{
		"anonymous":      nil,
		"wrong password": {nats.UserInfo("faas-gpu", "guess")},
		"wrong user":     {nats.UserInfo("admin", password)},
		"token":          {nats.Token(password)},
	} {
		nc, err := nats.Connect(s.ClientURL(), append(opts, nats.MaxReconnects(0))...)
		if err == nil {
			nc.Close()
			t.Errorf("%s: connected without the credentials", name)
		} else if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Errorf("%s: %v, want an authorization error", name, err)
		}
	}
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("faas-gpu", password))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.MaxPayload(); got != queue.MaxMessageBytes {
		t.Fatalf("max_payload %d, want queue.MaxMessageBytes %d", got, queue.MaxMessageBytes)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := queue.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, queue.Subject(queue.DefaultQueue), make([]byte, queue.MaxMessageBytes-1024)); err != nil {
		t.Fatalf("publishing a message just under queue.MaxMessageBytes: %v", err)
	}
}

// TestConnectionLimitSparesInProcessClients: with MaxConns TCP connections open and never authenticating, a new TCP
// client is refused, while a client connected through memory (InProcessConn: no descriptor, no listener) keeps
// publishing; once the stalled connections are gone (closed here; the auth timeout closes them otherwise), TCP
// clients connect again.
func TestConnectionLimitSparesInProcessClients(t *testing.T) {
	ctx := context.Background()
	s, err := natsserver.Start(ctx, natsserver.Config{StoreDir: t.TempDir(), Port: -1, Username: "u", Password: "p",
		MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	inproc, err := nats.Connect(s.ClientURL(), nats.InProcessServer(s), nats.UserInfo("u", "p"))
	if err != nil {
		t.Fatal(err)
	}
	defer inproc.Close()
	var stalled []net.Conn
	for i := 0; i < 7; i++ { // with the in-process client: 8
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		stalled = append(stalled, c)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := nats.Connect(s.ClientURL(), nats.UserInfo("u", "p"), nats.Timeout(time.Second))
		if err != nil {
			break // refused: the limit holds
		}
		if time.Now().After(deadline) {
			t.Fatal("a TCP client connected beyond MaxConns")
		}
		time.Sleep(20 * time.Millisecond)
	}
	js, err := jetstream.New(inproc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t"}}); err != nil {
		t.Fatalf("the in-process client at the limit: %v", err)
	}
	if _, err := js.Publish(ctx, "t", []byte("x")); err != nil {
		t.Fatalf("the in-process client at the limit: %v", err)
	}
	for _, c := range stalled {
		c.Close()
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("u", "p"), nats.Timeout(time.Second))
		if err == nil {
			nc.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("TCP clients after the storm: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
