package handoff

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestPlaneOpsAnswerOnTheNode: every data-plane operation sent over a control socket is answered by the method of
// the executor's Node its declaration binds (PlaneRoutes, no handler of its own): the controller's eviction drops
// the copy, its swap brings it back, WaitReady waits for it, MarkUnhealthy takes the GPU out of service (a GPU the
// node does not have is refused as a protocol error), Deregister drops the function, and the Node's own errors
// travel with their sentinels.
func TestPlaneOpsAnswerOnTheNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := sim.New(sim.Options{Node: spec})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memory.New(dev, memory.Config{Share: 1, MaxBytesPerGPU: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := repository.Open(repository.Config{Dir: t.TempDir(), Registrar: dev})
	if err != nil {
		t.Fatal(err)
	}
	node, err := executor.New(executor.Config{Device: dev, Memory: mem, Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = node.Close(ctx)
		_ = repo.Close()
		_ = mem.Close(ctx)
		_ = dev.Close(ctx)
	}()
	// f's model: allocated under a binding, captured as its image when its initialisation ends.
	if err := node.Register("f"); err != nil {
		t.Fatal(err)
	}
	b, err := node.Acquire(ctx, "f", 0, executor.Host)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.Alloc(ctx, "f", 4<<20); err != nil {
		t.Fatal(err)
	}
	b.Release()
	if err := node.EndInit(ctx, "f"); err != nil {
		t.Fatal(err)
	}

	mine, theirs, err := Socketpair()
	if err != nil {
		t.Fatal(err)
	}
	other, err := FileConn(theirs)
	theirs.Close()
	if err != nil {
		t.Fatal(err)
	}
	exec := NewPeer(other, Routes(ToExecutor, PlaneRoutes(func() executor.DataPlane { return node })...), Codes, nil)
	go func() { _ = exec.Serve(ctx) }()
	gpuserver := NewPeer(mine, nil, Codes, nil)
	go func() { _ = gpuserver.Serve(ctx) }()
	defer func() { _ = gpuserver.Close(); <-exec.Done(); <-gpuserver.Done() }()

	resident := func() []int {
		t.Helper()
		gpus, _, err := node.Resident("f")
		if err != nil {
			t.Fatal(err)
		}
		return gpus
	}
	if _, err := OpEvict.Call(ctx, gpuserver, Evict{Function: "f", GPU: 0}); err != nil {
		t.Fatal(err)
	}
	if got := resident(); len(got) != 0 {
		t.Fatalf("after OpEvict f is resident on %v", got)
	}
	if _, err := OpSwapIn.Call(ctx, gpuserver, SwapIn{Function: "f", GPU: 1, Source: executor.Host}); err != nil {
		t.Fatal(err)
	}
	if _, err := OpWaitReady.Call(ctx, gpuserver, Name{Function: "f"}); err != nil {
		t.Fatal(err)
	}
	if got := resident(); !slices.Equal(got, []int{1}) {
		t.Fatalf("after OpSwapIn to gpu 1 f is resident on %v", got)
	}
	if _, err := OpEvict.Call(ctx, gpuserver, Evict{Function: "f", GPU: 9}); !errors.Is(err, executor.ErrInvalid) {
		t.Fatalf("an eviction on a GPU the node lacks: %v, want executor.ErrInvalid from the Node", err)
	}
	if _, err := OpMarkUnhealthy.Call(ctx, gpuserver, MarkUnhealthy{GPU: 4, Cause: "x"}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("MarkUnhealthy of gpu 4 of 4: %v, want ErrProtocol", err)
	}
	if _, err := OpMarkUnhealthy.Call(ctx, gpuserver, MarkUnhealthy{GPU: 2, Cause: "test"}); err != nil {
		t.Fatal(err)
	}
	if node.Healthy(2) || !node.Healthy(1) {
		t.Fatalf("healthy after OpMarkUnhealthy of gpu 2: gpu 2 %v, gpu 1 %v", node.Healthy(2), node.Healthy(1))
	}
	if _, err := OpDeregister.Call(ctx, gpuserver, Name{Function: "f"}); err != nil {
		t.Fatal(err)
	}
	if _, err := OpWaitReady.Call(ctx, gpuserver, Name{Function: "f"}); !errors.Is(err, executor.ErrUnknownFunction) {
		t.Fatalf("WaitReady after OpDeregister: %v, want executor.ErrUnknownFunction", err)
	}
}
