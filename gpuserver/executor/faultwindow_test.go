package executor_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/repository"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// holdingDevice is the sim whose next context Destroy, once armed, says it started (destroying) and waits for
// proceed: the window in which the node tears a poisoned context down with its lock released.
type holdingDevice struct {
	device.Backend
	armed      atomic.Bool
	destroying chan struct{}
	proceed    chan struct{}
}

func (d *holdingDevice) NewContext(gpu int) (device.Context, error) {
	c, err := d.Backend.NewContext(gpu)
	if err != nil {
		return nil, err
	}
	return &holdingContext{Context: c, d: d}, nil
}

type holdingContext struct {
	device.Context
	d *holdingDevice
}

func (c *holdingContext) Destroy() error {
	if c.d.armed.CompareAndSwap(true, false) {
		close(c.d.destroying)
		<-c.d.proceed
	}
	return c.Context.Destroy()
}

// holdingRig is simRig with the executor on a holdingDevice (memory and repository on the sim itself).
func holdingRig(t *testing.T) (*rig, *holdingDevice) {
	t.Helper()
	node, err := topology.Preset("v100x4")
	must(t, err)
	opts := sim.Options{}
	opts.Node, err = node.WithGPUMemory(64 << 20)
	must(t, err)
	dev, err := sim.New(opts)
	must(t, err)
	d := &holdingDevice{Backend: dev, destroying: make(chan struct{}), proceed: make(chan struct{})}
	mem, err := memory.New(dev, memory.Config{Share: 1, MaxBytesPerGPU: 256 << 20})
	must(t, err)
	repo, err := repository.Open(repository.Config{Dir: shmDir(t), Registrar: dev})
	must(t, err)
	n, err := executor.New(executor.Config{Device: d, Memory: mem, Repository: repo})
	must(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			t.Error(err)
		}
		_ = repo.Close()
		_ = dev.Close(ctx)
	})
	return &rig{dev: dev, mem: mem, repo: repo, node: n}, d
}

// TestSynchronizeWhileAFaultIsTornDownReportsTheLoss: a's kernel faults on GPU 0, where c of the same namespace
// is active with work of its own queued. While the node destroys the poisoned context (its lock released), c
// synchronises: its work went with the context, so the answer is a context fault, never success; and so it is
// once the teardown has ended, for a and c alike. Before the loss was recorded with the removal of the streams,
// c's synchronisation in that window answered nil.
func TestSynchronizeWhileAFaultIsTornDownReportsTheLoss(t *testing.T) {
	r, d := holdingRig(t)
	ctx := context.Background()
	a := initModel(t, r, "a.ns1", 0, 4096)
	c := initModel(t, r, "c.ns1", 0, 4096)
	bindA, err := r.node.Acquire(ctx, "a.ns1", 0, executor.Host)
	must(t, err)
	defer bindA.Release()
	bindC, err := r.node.Acquire(ctx, "c.ns1", 0, executor.Host)
	must(t, err)
	defer bindC.Release()
	sa, err := r.node.Stream("a.ns1")
	must(t, err)
	sc, err := r.node.Stream("c.ns1")
	must(t, err)
	out := make([]byte, 4096)
	must(t, sc.CopyDtoH(out, c.blocks[0])) // c's work, queued in the tenant's context
	f := addKernel(t, r, "a.ns1", 0)
	args, err := device.PackArgs(f.Params(), device.Ptr(0x1000), a.blocks[0], a.blocks[0], uint32(1024))
	must(t, err)
	must(t, sa.Launch(f, device.Dim3{X: 4}, device.Dim3{X: 256}, 0, args)) // a bad pointer: faults at its sync

	d.armed.Store(true)
	faulted := make(chan error, 1)
	go func() { faulted <- sa.Synchronize(ctx) }()
	select {
	case <-d.destroying:
	case err := <-faulted:
		t.Fatalf("a's synchronisation ended before the context was destroyed: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the poisoned context was not destroyed within 60s")
	}
	// The teardown is under way, the node's lock released. c's synchronisation may wait for it (then it ends
	// below) or answer at once; either way it must report the loss.
	inWindow := make(chan error, 1)
	go func() { inWindow <- sc.Synchronize(ctx) }()
	var errC error
	answered := false
	select {
	case errC = <-inWindow:
		answered = true
	case <-time.After(time.Second):
	}
	close(d.proceed)
	if !answered {
		select {
		case errC = <-inWindow:
		case <-time.After(60 * time.Second):
			t.Fatal("c's synchronisation did not end within 60s of the teardown")
		}
	}
	if !errors.Is(errC, executor.ErrContextFault) {
		t.Errorf("c synchronising while its namespace's context was torn down: %v, want ErrContextFault", errC)
	}
	if err := <-faulted; !errors.Is(err, executor.ErrContextFault) {
		t.Errorf("a's faulting synchronisation: %v, want ErrContextFault", err)
	}
	if err := sc.Synchronize(ctx); !errors.Is(err, executor.ErrContextFault) {
		t.Errorf("c synchronising after the teardown: %v, want ErrContextFault", err)
	}
	for _, b := range []*executor.Binding{bindA, bindC} {
		if !errors.Is(b.Err(), executor.ErrBroken) {
			t.Errorf("%s's binding across the fault: %v, want ErrBroken", b.Function(), b.Err())
		}
	}
}
