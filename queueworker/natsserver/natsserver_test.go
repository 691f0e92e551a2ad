package natsserver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/faas-gpu/faas-gpu/queueworker/natsserver"
)

func TestStartRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]natsserver.Config{
		"no store":  {Port: -1},
		"port 0":    {StoreDir: t.TempDir(), Port: 0},
		"port high": {StoreDir: t.TempDir(), Port: 70000},
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
	s, err := natsserver.Start(ctx, natsserver.Config{StoreDir: dir, Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	port := s.Port()
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
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

	s2, err := natsserver.Start(ctx, natsserver.Config{StoreDir: dir, Port: port})
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
