package executor_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// Tenants kept apart and a fault contained to its tenant, at the executors, on both backends: the sim in every `make
// test`, a real GPU in the GPU suite (FAAS_GPU_TEST_CUDA=1 go test -run CUDA ./gpuserver/executor/). The same checks
// run through the shim's wire protocol in gpuserver/remoting (tenant_test.go) on the sim.

// simRig is a rig on a simulated v100x4 with 64 MiB per GPU.
func simRig(t *testing.T) *rig { return newRig(t, 64<<20, sim.Options{}, false) }

// In one process (the executors of --tenant-isolation=none), on the sim's per-context model. On a real GPU a context
// does not isolate (docs/security.md): the GPU suite's versions of these checks run each tenant in an executor
// process of its own (tenants_test.go).
func TestKernelsCannotReachAnotherTenant(t *testing.T) { kernelsCannotReachAnotherTenant(t, simRig(t)) }

func TestKernelFaultPoisonsOnlyItsContext(t *testing.T) {
	kernelFaultPoisonsOnlyItsContext(t, simRig(t))
}

// addKernel loads the reference kernels in fn's context on gpu and returns vector_add.
func addKernel(t *testing.T, r *rig, fn string, gpu int) device.Function {
	t.Helper()
	dctx, err := r.node.Context(fn, gpu)
	must(t, err)
	mod, err := dctx.LoadModule(kernels.PTX())
	must(t, err)
	f, err := mod.Function("vector_add")
	must(t, err)
	return f
}

// add runs c = a + b over n floats on fn's stream and returns the synchronisation's error.
func add(t *testing.T, r *rig, fn string, f device.Function, a, b, c device.Ptr, n uint32) error {
	t.Helper()
	s, err := r.node.Stream(fn)
	must(t, err)
	args, err := device.PackArgs(f.Params(), a, b, c, n)
	must(t, err)
	if err := s.Launch(f, device.Dim3{X: (n + 255) / 256}, device.Dim3{X: 256}, 0, args); err != nil {
		return err
	}
	return s.Synchronize(context.Background())
}

func readBack(t *testing.T, r *rig, fn string, p device.Ptr, n int) []byte {
	t.Helper()
	s, err := r.node.Stream(fn)
	must(t, err)
	out := make([]byte, n)
	must(t, s.CopyDtoH(out, p))
	must(t, s.Synchronize(context.Background()))
	return out
}

// kernelsCannotReachAnotherTenant: function a (namespace ns1) holds a secret on GPU 0; function b (ns2), bound to
// GPU 0 next, launches kernels that read and write a's address. They fault in b's context; a's bytes are
// unchanged; the GPU stays healthy. A function of a's namespace shares a's address space.
func kernelsCannotReachAnotherTenant(t *testing.T, r *rig) {
	ctx := context.Background()
	a := initModel(t, r, "a.ns1", 0, 4096)
	b := initModel(t, r, "b.ns2", 0, 4096) // binding b on GPU 0 parks a there
	if _, active, _ := r.node.Resident("a.ns1"); active == 0 {
		t.Fatal("a is still active (mapped) on gpu 0 while b of another namespace runs there")
	}
	bind, err := r.node.Acquire(ctx, "b.ns2", 0, executor.Host)
	must(t, err)
	f := addKernel(t, r, "b.ns2", 0)
	err = add(t, r, "b.ns2", f, a.blocks[0], b.blocks[0], b.blocks[0], 1024)
	if !errors.Is(err, executor.ErrContextFault) || !device.IsContextFault(err) {
		t.Fatalf("b's kernel reading a's memory: %v, want a context fault", err)
	}
	if !errors.Is(bind.Err(), executor.ErrBroken) {
		t.Fatalf("b's binding across its fault: %v, want ErrBroken", bind.Err())
	}
	bind.Release()
	bind, err = r.node.Acquire(ctx, "b.ns2", 0, executor.Host)
	must(t, err)
	f = addKernel(t, r, "b.ns2", 0) // its context was torn down with its modules
	if err := add(t, r, "b.ns2", f, b.blocks[0], b.blocks[0], a.blocks[0], 1024); !device.IsContextFault(err) {
		t.Fatalf("b's kernel writing a's memory: %v, want a context fault", err)
	}
	bind.Release()
	if !r.node.Healthy(0) {
		t.Fatal("gpu 0 out of service after b's faults")
	}
	bind, err = r.node.Acquire(ctx, "a.ns1", 0, executor.Host)
	must(t, err)
	if got := readBack(t, r, "a.ns1", a.blocks[0], 4096); !bytes.Equal(got, a.data[0]) {
		t.Fatal("a's memory changed")
	}
	// c, of a's namespace, shares a's address space on the GPU.
	c := initModel(t, r, "c.ns1", 0, 4096)
	if _, active, _ := r.node.Resident("a.ns1"); active != 0 {
		t.Fatal("a was parked for c of the same namespace")
	}
	fc := addKernel(t, r, "c.ns1", 0)
	if err := add(t, r, "c.ns1", fc, a.blocks[0], c.blocks[0], c.blocks[0], 16); err != nil {
		t.Fatalf("c reading a's memory (same namespace): %v", err)
	}
	bind.Release()
}

// kernelFaultPoisonsOnlyItsContext: a's kernel faults on GPU 0 while c (same namespace) is active there too. The
// fault is answered with a context fault; GPU 0 stays healthy; a and c come back from their images; b (another
// namespace) then runs on GPU 0 unharmed.
func kernelFaultPoisonsOnlyItsContext(t *testing.T, r *rig) {
	ctx := context.Background()
	b := initModel(t, r, "b.ns2", 0, 4096)
	a := initModel(t, r, "a.ns1", 0, 4096, 3<<20)
	c := initModel(t, r, "c.ns1", 0, 4096)
	bind, err := r.node.Acquire(ctx, "a.ns1", 0, executor.Host)
	must(t, err)
	f := addKernel(t, r, "a.ns1", 0)
	err = add(t, r, "a.ns1", f, 0x1000, a.blocks[0], a.blocks[0], 1024) // a bad pointer
	if !errors.Is(err, executor.ErrContextFault) {
		t.Fatalf("a's bad kernel: %v, want ErrContextFault", err)
	}
	if !errors.Is(bind.Err(), executor.ErrBroken) {
		t.Fatalf("the faulting request's binding: %v, want ErrBroken (its work must not be served)", bind.Err())
	}
	bind.Release()
	st := r.node.Status()[0]
	if !st.Healthy || st.ContextFaults != 1 {
		t.Fatalf("gpu 0 after the fault: healthy %v, %d context faults (%s)", st.Healthy, st.ContextFaults, st.Error)
	}
	for _, m := range []model{a, c, b} {
		bind, err := r.node.Acquire(ctx, m.name, 0, executor.Host)
		must(t, err)
		for i := range m.blocks {
			if got := readBack(t, r, m.name, m.blocks[i], len(m.data[i])); !bytes.Equal(got, m.data[i]) {
				t.Fatalf("%s block %d after the fault differs", m.name, i)
			}
		}
		bind.Release()
	}
	bind, err = r.node.Acquire(ctx, "a.ns1", 0, executor.Host)
	must(t, err)
	scratch, err := r.node.Alloc(ctx, "a.ns1", 4096)
	must(t, err)
	f = addKernel(t, r, "a.ns1", 0)
	if err := add(t, r, "a.ns1", f, a.blocks[0], a.blocks[0], scratch, 1024); err != nil {
		t.Fatalf("a's kernel after the recovery: %v", err)
	}
	bind.Release()
	if !r.node.Healthy(0) {
		t.Fatal("gpu 0 out of service")
	}
}
