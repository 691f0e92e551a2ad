package remoting

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// wireRig is a remoting server on a simulated node, with its binder (the GPUs tests bind functions to), its
// executors and its log.
type wireRig struct {
	srv    *Server
	sock   string
	logs   *testkit.Buffer
	binder *binder
	node   *executor.Node
	dev    *sim.Backend
}

// startServerWith runs a remoting server on a simulated node with cfg adjusted by adjust.
func startServerWith(t *testing.T, funcs registry, adjust func(*Config)) *wireRig {
	t.Helper()
	dev, xn := simNode(t, 256<<20)
	r := &wireRig{logs: &testkit.Buffer{}, binder: &binder{current: map[string]int{}}, node: xn, dev: dev}
	cfg := Config{Device: dev, Node: xn, Functions: funcs, Binder: r.binder,
		Logger: slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if adjust != nil {
		adjust(&cfg)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.srv, r.sock = srv, serve(t, srv)
	return r
}

func mustAlloc(t *testing.T, w *wireClient, size uint64) uint64 {
	t.Helper()
	r, out, err := w.call(CallCuMemAlloc_v2, size)
	if err != nil || r != ResultSuccess || len(out) != 8 {
		t.Fatalf("cuMemAlloc(%d): result %d, %d bytes, %v", size, r, len(out), err)
	}
	return leU64(out)
}

func leU64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// TestCraftedCopySizesAreRefused: a cuMemcpyDtoH whose byte count is near 2^64 made the
// response writer's size arithmetic wrap and panicked the whole process. Every such size is now answered with
// CUDA_ERROR_INVALID_VALUE, the session goes on, and another function's session never notices.
func TestCraftedCopySizesAreRefused(t *testing.T) {
	funcs := registry{
		"attacker":  {pool.FunctionSpec{Name: "attacker", MemoryBytes: 64 << 20}, "tok-a"},
		"bystander": {pool.FunctionSpec{Name: "bystander", MemoryBytes: 64 << 20}, "tok-b"},
	}
	r := startServerWith(t, funcs, nil)
	srv, sock := r.srv, r.sock
	by, err := dialWire(t, sock, "bystander", "tok-b")
	if err != nil {
		t.Fatal(err)
	}
	bp := mustAlloc(t, by, 4096)
	w, err := dialWire(t, sock, "attacker", "tok-a")
	if err != nil {
		t.Fatal(err)
	}
	p := mustAlloc(t, w, 4096)
	huge := []uint64{1<<64 - 1, 1<<64 - 7, 1<<64 - 8, 1 << 63, 1<<32 + 8, testRespSize, testRespSize - 8}
	for _, n := range huge {
		for _, id := range []CallID{CallCuMemcpyDtoH_v2, CallCuMemcpyDtoHAsync_v2} {
			args := []any{n, p, n}
			if id == CallCuMemcpyDtoHAsync_v2 {
				args = append(args, uint64(0))
			}
			r, out, err := w.call(id, args...)
			if err != nil {
				t.Fatalf("%s of %d bytes: %v", id, n, err)
			}
			if r != ResultInvalidValue || len(out) != 0 {
				t.Fatalf("%s of %d bytes: result %d with %d bytes, want CUDA_ERROR_INVALID_VALUE", id, n, r, len(out))
			}
		}
	}
	// The session and the other function's session go on.
	if r, out, err := w.call(CallCuMemcpyDtoH_v2, uint64(16), p, uint64(16)); err != nil || r != ResultSuccess ||
		len(out) != 8+16 {
		t.Fatalf("a sound copy after the crafted ones: result %d, %d bytes, %v", r, len(out), err)
	}
	if r, _, err := by.call(CallCuMemcpyDtoH_v2, uint64(16), bp, uint64(16)); err != nil || r != ResultSuccess {
		t.Fatalf("the bystander's copy: result %d, %v", r, err)
	}
	if st := srv.Stats(); st.SessionPanics != 0 {
		t.Fatalf("%d session panics", st.SessionPanics)
	}
}

// panicky is a handler whose cuCtxSynchronize panics (a bug some input reaches).
type panicky struct{ UnimplementedHandler }

func (panicky) CuCtxSynchronize(context.Context) Result { panic("a bug reached by some input") }
func (panicky) CuMemGetInfo_v2(context.Context) (uint64, uint64, Result) {
	return 1, 2, ResultSuccess
}

// TestPanicEndsOnlyItsSession: a panic while serving one session closes that session; the server logs it,
// counts it, and every other session (and new ones) go on.
func TestPanicEndsOnlyItsSession(t *testing.T) {
	funcs := registry{
		"bad":  {pool.FunctionSpec{Name: "bad", MemoryBytes: 1 << 20}, "tok-bad"},
		"good": {pool.FunctionSpec{Name: "good", MemoryBytes: 1 << 20}, "tok-good"},
	}
	r := startServerWith(t, funcs, func(c *Config) {
		c.NewHandler = func(context.Context, SessionInfo) (Handler, error) { return panicky{}, nil }
	})
	srv, sock, logs := r.srv, r.sock, r.logs
	good, err := dialWire(t, sock, "good", "tok-good")
	if err != nil {
		t.Fatal(err)
	}
	bad, err := dialWire(t, sock, "bad", "tok-bad")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := bad.call(CallCuCtxSynchronize); !errors.Is(err, errNoAnswer) {
		t.Fatalf("the panicking call: %v, want the session closed", err)
	}
	if r, _, err := good.call(CallCuMemGetInfo_v2); err != nil || r != ResultSuccess {
		t.Fatalf("the other session after the panic: %d %v", r, err)
	}
	again, err := dialWire(t, sock, "bad", "tok-bad")
	if err != nil {
		t.Fatalf("a new session after the panic: %v", err)
	}
	if r, _, err := again.call(CallCuMemGetInfo_v2); err != nil || r != ResultSuccess {
		t.Fatalf("a new session after the panic: %d %v", r, err)
	}
	if st := srv.Stats(); st.SessionPanics != 1 {
		t.Fatalf("%d session panics counted, want 1", st.SessionPanics)
	}
	if !strings.Contains(logs.String(), "session panicked") {
		t.Fatalf("the panic was not logged:\n%s", logs)
	}
}

// TestSessionsPerFunctionLimit: one function cannot hold more sessions than
// MaxSessionsPerFunction; the refusal names the limit, and other functions are not affected.
func TestSessionsPerFunctionLimit(t *testing.T) {
	funcs := registry{
		"greedy": {pool.FunctionSpec{Name: "greedy", MemoryBytes: 1 << 20}, "tok-g"},
		"other":  {pool.FunctionSpec{Name: "other", MemoryBytes: 1 << 20}, "tok-o"},
	}
	r := startServerWith(t, funcs, func(c *Config) { c.MaxSessionsPerFunction = 2 })
	srv, sock := r.srv, r.sock
	var held []*wireClient
	for range 2 {
		w, err := dialWire(t, sock, "greedy", "tok-g")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, w)
	}
	if _, err := dialWire(t, sock, "greedy", "tok-g"); err == nil ||
		!strings.Contains(err.Error(), "MaxSessionsPerFunction") {
		t.Fatalf("a third session: %v, want a refusal naming MaxSessionsPerFunction", err)
	}
	if _, err := dialWire(t, sock, "other", "tok-o"); err != nil {
		t.Fatalf("another function while greedy is at its limit: %v", err)
	}
	held[0].close()
	testkit.Eventually(t, 60*time.Second, "a session slot freed by a hang-up", func() bool {
		w, err := dialWire(t, sock, "greedy", "tok-g")
		if err == nil {
			w.close()
		}
		return err == nil
	})
	if n := srv.Stats().Refused["sessions_per_function"]; n < 1 {
		t.Fatalf("refusals counted: %d", n)
	}
}

// TestPendingHellosBounded: connections that never send a hello cannot pile up: beyond MaxPendingHellos new ones
// are closed at once, and once the silent ones are gone the server accepts again.
func TestPendingHellosBounded(t *testing.T) {
	funcs := registry{"f": {pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20}, "tok"}}
	r := startServerWith(t, funcs, func(c *Config) {
		c.MaxPendingHellos = 2
		c.HelloTimeout = 10 * time.Minute // the silent connections leave by closing, not by timing out
	})
	srv, sock := r.srv, r.sock
	var silent []net.Conn
	for range 2 {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	testkit.Eventually(t, 60*time.Second, "a connection beyond the limit closed at once", func() bool {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		return err != nil && !isTimeout(err) && srv.Stats().Refused["pending_hellos"] > 0
	})
	for _, c := range silent {
		c.Close()
	}
	testkit.Eventually(t, 60*time.Second, "a hello accepted once the silent connections are gone", func() bool {
		w, err := dialWire(t, sock, "f", "tok")
		if err == nil {
			w.close()
		}
		return err == nil
	})
}

// TestAcceptRecoversFromDescriptorExhaustion: after the process ran out of file descriptors
// the remoting listener stopped accepting for good. Now a failed accept is logged, counted and retried with a
// back-off: with every descriptor of the process in use, a client (another process) connects; the server's
// accepts fail with EMFILE; once descriptors are free again the pending connection and new ones are served.
func TestAcceptRecoversFromDescriptorExhaustion(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	funcs := registry{"f": {pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20}, "tok"}}
	r := startServerWith(t, funcs, nil)
	srv, sock, logs := r.srv, r.sock, r.logs
	// A client in another process (its descriptors are its own): it connects when told to on stdin.
	client := exec.Command("python3", "-c", `
import socket, sys
sys.stdin.readline()
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
print("connected", flush=True)
sys.stdin.readline()
`, sock)
	in, err := client.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out testkit.Buffer
	client.Stdout = &out
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close(); _ = client.Wait() })

	release := testkit.ExhaustDescriptors(t)
	if _, err := fmt.Fprintln(in, "connect"); err != nil {
		release()
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for srv.Stats().AcceptErrors == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	errs := srv.Stats().AcceptErrors
	release()
	if errs == 0 {
		t.Fatalf("the server never failed an accept with every descriptor in use (client: %q)", out.String())
	}
	testkit.Eventually(t, 60*time.Second, "a hello served after the descriptors came back", func() bool {
		w, err := dialWire(t, sock, "f", "tok")
		if err == nil {
			w.close()
		}
		return err == nil
	})
	for _, want := range []string{"accept failed", "accepting again"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
}
