package sim_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
)

func vectorAddArgs(a, b, c device.Ptr, n uint32) []byte {
	args := make([]byte, 28)
	binary.LittleEndian.PutUint64(args, uint64(a))
	binary.LittleEndian.PutUint64(args[8:], uint64(b))
	binary.LittleEndian.PutUint64(args[16:], uint64(c))
	binary.LittleEndian.PutUint32(args[24:], n)
	return args
}

// TestContextsModelTheDriver pins what a context isolates on the sim, as on the driver: memory mapped through the
// backend is reachable from every context of a GPU it is accessible on; a module's memory only from its own
// context; a fault (here a kernel reading unmapped memory) poisons its context alone, stickily, and leaves other
// contexts, the backend's own streams and the GPU in service.
func TestContextsModelTheDriver(t *testing.T) {
	ctx := context.Background()
	b := newSim(t, sim.Options{})
	ca, err := b.NewContext(0)
	must(t, err)
	cb, err := b.NewContext(0)
	must(t, err)
	sa, err := ca.NewStream()
	must(t, err)
	sb, err := cb.NewStream()
	must(t, err)

	// Mapped memory: the process's; both contexts of GPU 0 reach it.
	buf := mapOn(t, b, 0, sim.DefaultGranularity)
	must(t, sa.CopyHtoD(buf, []byte("shared mapping")))
	must(t, sa.Synchronize(ctx))
	got := make([]byte, 14)
	must(t, sb.CopyDtoH(got, buf))
	must(t, sb.Synchronize(ctx))
	if string(got) != "shared mapping" {
		t.Fatalf("read %q through the other context", got)
	}

	// Module memory: its context's. B cannot read A's global, by copy or by kernel.
	src := []byte(".version 7.0\n.target sm_50\n.address_size 64\n.visible .global .align 4 .b8 secret[64];\n")
	ma, err := ca.LoadModule(src)
	must(t, err)
	gp, _, err := ma.Global("secret")
	must(t, err)
	must(t, sa.CopyHtoD(gp, []byte("A's module global")))
	must(t, sa.Synchronize(ctx))
	must(t, sb.CopyDtoH(got, gp))
	if err := sb.Synchronize(ctx); !errors.Is(err, device.ErrIllegalAddress) {
		t.Fatalf("context B read context A's module global: %v", err)
	}
	if !errors.Is(cb.Err(), device.ErrIllegalAddress) {
		t.Fatalf("B's fault did not poison B: %v", cb.Err())
	}
	// Sticky: every later call of B fails with it, its other streams too, and nothing new is made in it.
	if err := sb.CopyHtoD(buf, []byte("x")); !errors.Is(err, device.ErrIllegalAddress) {
		t.Fatalf("a copy after the fault: %v", err)
	}
	if err := sb.Synchronize(ctx); !errors.Is(err, device.ErrIllegalAddress) {
		t.Fatalf("a second synchronize after the fault: %v", err)
	}
	if _, err := cb.NewStream(); !errors.Is(err, device.ErrIllegalAddress) {
		t.Fatalf("a new stream in the poisoned context: %v", err)
	}
	// A, the backend's own streams and the GPU go on.
	must(t, sa.CopyDtoH(got, gp))
	must(t, sa.Synchronize(ctx))
	if string(got[:14]) != "A's module glo" {
		t.Fatalf("A's global after B's fault: %q", got)
	}
	if ca.Err() != nil {
		t.Fatalf("A poisoned by B's fault: %v", ca.Err())
	}
	own, err := b.NewStream(0)
	must(t, err)
	must(t, own.CopyDtoH(got, buf))
	must(t, own.Synchronize(ctx))

	// A kernel of A launched with a stream of B (or the backend's) is refused: kernels run in their context.
	mk, err := ca.LoadModule(kernels.PTX())
	must(t, err)
	add, err := mk.Function("vector_add")
	must(t, err)
	if err := own.Launch(add, device.Dim3{X: 1}, device.Dim3{X: 4}, 0, vectorAddArgs(buf, buf, buf, 4)); !errors.Is(err,
		device.ErrInvalidValue) {
		t.Fatalf("a kernel of context A on the backend's stream: %v", err)
	}
	// A kernel fault poisons A now, not the GPU.
	must(t, sa.Launch(add, device.Dim3{X: 1}, device.Dim3{X: 4}, 0, vectorAddArgs(buf, 0x1000, buf, 4)))
	if err := sa.Synchronize(ctx); !errors.Is(err, device.ErrIllegalAddress) {
		t.Fatalf("a kernel reading unmapped memory: %v", err)
	}
	must(t, own.CopyDtoH(got, buf))
	must(t, own.Synchronize(ctx))

	// Destroy works on poisoned contexts; a new context on the GPU works.
	must(t, ca.Destroy())
	must(t, cb.Destroy())
	cc, err := b.NewContext(0)
	must(t, err)
	sc, err := cc.NewStream()
	must(t, err)
	must(t, sc.CopyDtoH(got, buf))
	must(t, sc.Synchronize(ctx))
	must(t, cc.Destroy())
}

// TestZeroingDropsPages: a memset of zero over whole pages and parts of pages leaves zeros everywhere it covered
// and nothing else changed (the sim drops whole pages instead of writing them).
func TestZeroingDropsPages(t *testing.T) {
	ctx := context.Background()
	b := newSim(t, sim.Options{})
	g := uint64(sim.DefaultGranularity)
	p := mapOn(t, b, 0, 2*g)
	s, err := b.NewStream(0)
	must(t, err)
	must(t, s.Memset8(p, 0xab, 2*g))
	must(t, s.Memset8(p+100, 0, g+50)) // a page's tail, and the next page's head
	out := make([]byte, 2*g)
	must(t, s.CopyDtoH(out, p))
	must(t, s.Synchronize(ctx))
	for i, v := range out {
		if want := byte(0xab); uint64(i) >= 100 && uint64(i) < g+150 {
			want = 0
			if v != want {
				t.Fatalf("byte %d = %#x, want 0", i, v)
			}
		} else if v != want {
			t.Fatalf("byte %d = %#x, want %#x", i, v, want)
		}
	}
	must(t, s.Memset8(p, 0, 2*g))
	must(t, s.CopyDtoH(out, p))
	must(t, s.Synchronize(ctx))
	for i, v := range out {
		if v != 0 {
			t.Fatalf("byte %d = %#x after zeroing both pages", i, v)
		}
	}
}
