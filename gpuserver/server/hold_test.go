package server

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestBindingHeldForeverIsEnded: on a node of one GPU a request acquires its binding and never releases it.
// Before, every other function's acquire waited until it gave up (504 through the template). Now the binding is
// ended after the maximum hold: the other function is bound, the holder's work is refused meanwhile, and the
// holder's late release answers that its binding broke (503).
func TestBindingHeldForeverIsEnded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const hold = 300 * time.Millisecond
	s, err := Start(ctx, Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
		RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
		RepositoryDir: filepath.Join(dir, "repository"), DeviceReserveBytes: 64 << 20, MaxBindingHold: hold})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	p := s.Pool()
	for _, name := range []string{"hog", "other.ns2"} {
		if err := p.Register(ctx, pool.FunctionSpec{Name: name, MemoryBytes: 16 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	held, err := p.Acquire(ctx, "hog")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	actx, acancel := context.WithTimeout(ctx, 20*time.Second)
	defer acancel()
	b, err := p.Acquire(actx, "other.ns2")
	if err != nil {
		t.Fatalf("the other function waiting behind a binding held forever: %v", err)
	}
	waited := time.Since(start)
	if waited < hold/2 {
		t.Fatalf("the other function was bound after %s, before the hold of %s ended", waited, hold)
	}
	if err := s.Executors().Usable("hog"); !errors.Is(err, executor.ErrHoldExpired) {
		t.Fatalf("the holder's work after the expiry: %v, want refused", err)
	}
	if err := p.Release(ctx, b.ID); err != nil {
		t.Fatalf("the other function's release: %v", err)
	}
	if err := p.Release(ctx, held.ID); !errors.Is(err, pool.ErrBindingBroken) {
		t.Fatalf("the holder's late release: %v, want ErrBindingBroken (503)", err)
	}
	if n := s.pool.HoldsExpired(); n != 1 {
		t.Fatalf("%d bindings counted as held too long, want 1", n)
	}
	// The holder works again after its release, and a binding released in time is not ended.
	again, err := p.Acquire(ctx, "hog")
	if err != nil {
		t.Fatalf("the holder after its release: %v", err)
	}
	if err := p.Release(ctx, again.ID); err != nil {
		t.Fatalf("a binding released in time: %v", err)
	}
	t.Logf("the other function was bound after %s (maximum hold %s)", waited.Round(time.Millisecond), hold)
}

// TestBindingHeldTooLongInATenantExecutor is the maximum hold with an executor process per tenant (the default on
// up): on a node of one GPU, a request of hog.ns1 acquires its binding and sends no work while a request of
// other.ns2 waits. Once the hold ends, the other function is bound and served; the holder's late work, sent to its
// tenant's executor, is refused there (before, the executor only released the binding, and the late work was bound
// afresh and ran); the holder's release answers that its binding broke (503); after it, the holder is served again.
func TestBindingHeldTooLongInATenantExecutor(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python processes through the shim and executor processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const hold = 500 * time.Millisecond
	tc, _ := tenantConfig(t)
	s, err := Start(ctx, Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
		RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
		RepositoryDir: filepath.Join(dir, "repository"), DeviceReserveBytes: 256 << 20, MaxBindingHold: hold,
		Tenants: tc})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(t, s)
	p := s.Pool()
	for _, fn := range []string{"hog.ns1", "other.ns2"} {
		if err := p.Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: 64 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	const want = "sum 1.0496e+06"
	hog, other := startFn(t, s, "hog.ns1", faultyPy), startFn(t, s, "other.ns2", faultyPy)
	for _, x := range []struct {
		p  *fnProcess
		fn string
	}{{hog, "hog.ns1"}, {other, "other.ns2"}} {
		if l, _, err := request(ctx, s, x.p, x.fn, "good"); l != want || err != nil {
			t.Fatalf("%s before the hold: %q %v\n%s", x.fn, l, err, x.p.Stderr())
		}
	}

	held, err := p.Acquire(ctx, "hog.ns1")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if l, _, err := request(ctx, s, other, "other.ns2", "good"); l != want || err != nil {
		t.Fatalf("the other function behind a binding held too long: %q %v", l, err)
	}
	if waited := time.Since(start); waited < hold/2 {
		t.Fatalf("the other function was served after %s, before the hold of %s ended", waited, hold)
	}
	if err := hog.Send("try"); err != nil {
		t.Fatal(err)
	}
	if l, err := hog.next(); err != nil || !strings.HasPrefix(l, "error ") {
		t.Fatalf("the holder's late work after the hold ended: %q %v, want it refused\n%s", l, err,
			hog.Stderr())
	}
	if err := p.Release(ctx, held.ID); !errors.Is(err, pool.ErrBindingBroken) {
		t.Fatalf("the holder's late release: %v, want ErrBindingBroken (503)", err)
	}
	if n := s.pool.HoldsExpired(); n != 1 {
		t.Fatalf("%d bindings counted as held too long, want 1", n)
	}
	if l, _, err := request(ctx, s, hog, "hog.ns1", "good"); l != want || err != nil {
		t.Fatalf("the holder after its release: %q %v\n%s", l, err, hog.Stderr())
	}
	for _, ts := range s.Pool().Status(ctx).Tenants {
		if ts.Restarts != 0 || ts.Faults != 0 {
			t.Errorf("ending the binding restarted or faulted an executor: %+v", ts)
		}
	}
}
