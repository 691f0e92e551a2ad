package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// TestSocketsOnlyForTheirOwner: the API and remoting sockets were world-writable (0666), so
// any local user could call them. They are mode 0600 now (0660 for a configured group), and the key file every
// credential derives from is 0600; a key file others can read is refused at start.
func TestSocketsOnlyForTheirOwner(t *testing.T) {
	dir := t.TempDir()
	s := startTestServer(t, dir)
	for _, p := range []string{s.Socket(), s.RemotingSocket(), filepath.Join(dir, "key")} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %04o, want 0600", p, st.Mode().Perm())
		}
	}
	stop(t, s)

	// With a socket group: 0660 and that group.
	gid := os.Getgid()
	node, _ := topology.Preset("v100x4")
	s2, err := Start(context.Background(), Config{Socket: filepath.Join(dir, "api2.sock"), Node: node,
		SocketGroup: strconv.Itoa(gid)})
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(s2.Socket())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o660 {
		t.Errorf("socket with a group: mode %04o, want 0660", st.Mode().Perm())
	}
	stop(t, s2)

	if err := os.Chmod(filepath.Join(dir, "key"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Start(context.Background(), Config{Socket: filepath.Join(dir, "api3.sock"), Node: node,
		KeyFile: filepath.Join(dir, "key")})
	if err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("start with a key file others can read: %v", err)
	}
}

// TestNamesAndRegistrationsBounded: function names are bounded in length and alphabet, and
// a gpuserver holds at most MaxFunctions registrations (updates of a registered function always pass).
func TestNamesAndRegistrationsBounded(t *testing.T) {
	ctx := context.Background()
	node, _ := topology.Preset("v100x4")
	s, err := Start(ctx, Config{Socket: filepath.Join(t.TempDir(), "api.sock"), Node: node, MaxFunctions: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	admin := client.New(s.Socket(), client.WithToken(s.AdminToken()))
	for _, name := range []string{"", strings.Repeat("a", pool.MaxNameLength+1), "../etc", "a/b", "a b", "a\x00b",
		"-lead", "ünï"} {
		if err := admin.Register(ctx, pool.FunctionSpec{Name: name, MemoryBytes: 1 << 20}); !errors.Is(err,
			pool.ErrInvalidSpec) || !strings.Contains(err.Error(), "name") {
			t.Errorf("name %q: %v, want a 400 naming the name", name, err)
		}
	}
	for _, name := range []string{"a", strings.Repeat("b", pool.MaxNameLength)} {
		if err := admin.Register(ctx, pool.FunctionSpec{Name: name, MemoryBytes: 1 << 20}); err != nil {
			t.Fatalf("%q: %v", name, err)
		}
	}
	if err := admin.Register(ctx, pool.FunctionSpec{Name: "c", MemoryBytes: 1 << 20}); !errors.Is(err, pool.ErrLimit) ||
		!strings.Contains(err.Error(), "MaxFunctions") {
		t.Fatalf("a registration beyond MaxFunctions: %v", err)
	}
	if err := admin.Register(ctx, pool.FunctionSpec{Name: "a", MemoryBytes: 2 << 20}); err != nil {
		t.Fatalf("updating a registered function at the limit: %v", err)
	}
	if err := admin.Deregister(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := admin.Register(ctx, pool.FunctionSpec{Name: "c", MemoryBytes: 1 << 20}); err != nil {
		t.Fatalf("a registration after a deregistration freed a place: %v", err)
	}
}

// TestNoHealthyGPUAnswersAtOnce: with every GPU out of service a request waited its whole
// acquire timeout (30 s) for a 504. It now fails at once with 503, and an acquire already waiting fails as soon
// as the last GPU is taken out of service.
func TestNoHealthyGPUAnswersAtOnce(t *testing.T) {
	ctx := context.Background()
	s := startTestServer(t, t.TempDir())
	defer stop(t, s)
	admin := client.New(s.Socket(), client.WithToken(s.AdminToken()))
	if err := admin.Register(ctx, pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	fc := client.New(s.Socket(), client.WithToken(s.Token("f")))
	held, err := fc.Acquire(ctx, "f", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// One binding per function at a time with executors: this one waits for the first.
	waiting := make(chan error, 1)
	go func() {
		_, err := fc.Acquire(ctx, "f", 10*time.Minute)
		waiting <- err
	}()
	testkit.Eventually(t, 60*time.Second, "the second acquire queued", func() bool {
		st := s.Pool().Status(ctx)
		return len(st.Functions) == 1 && st.Functions[0].Queued == 1
	})
	for g := range s.Executors().GPUs() {
		s.Executors().MarkUnhealthy(g, errors.New("injected: the GPU fell off the bus"))
	}
	_ = s.Pool().Status(ctx) // the pool learns about GPU health at acquires, releases and status
	if err := <-waiting; !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "no healthy GPU") {
		t.Fatalf("the waiting acquire: %v, want 503 no healthy GPU", err)
	}
	if _, err := fc.Acquire(ctx, "f", 10*time.Minute); !errors.Is(err, client.ErrUnavailable) ||
		!strings.Contains(err.Error(), "no healthy GPU") {
		t.Fatalf("a new acquire: %v, want 503 no healthy GPU", err)
	}
	_ = fc.Release(ctx, held.ID)
}
