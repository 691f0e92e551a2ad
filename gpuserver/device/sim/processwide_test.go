package sim_test

import (
	"context"
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
)

// TestProcessWideModelsTheH100: with Options.ProcessWide the sim does what the GPU suite measured on an H100 inside
// one process: a kernel of context B reads a module global of context A and registered host memory by its host
// address, and a kernel fault of A poisons B, the backend's own streams and new contexts. Without it (the
// default), each of those is refused or contained, as docs/security.md once assumed of contexts.
func TestProcessWideModelsTheH100(t *testing.T) {
	for _, processWide := range []bool{false, true} {
		ctx := context.Background()
		b := newSim(t, sim.Options{ProcessWide: processWide})
		ca, err := b.NewContext(0)
		must(t, err)
		sa, err := ca.NewStream()
		must(t, err)
		out := mapOn(t, b, 0, sim.DefaultGranularity)
		add := func(c device.Context, s device.Stream, a device.Ptr, n uint32) error {
			m, err := c.LoadModule(kernels.PTX())
			if err != nil {
				return err
			}
			f, err := m.Function("vector_add")
			must(t, err)
			if err := s.Launch(f, device.Dim3{X: 1}, device.Dim3{X: n}, 0, vectorAddArgs(a, a, out, n)); err != nil {
				return err
			}
			return s.Synchronize(ctx)
		}
		// A module global of A, read by a kernel of B.
		ma, err := ca.LoadModule([]byte(".version 7.0\n.target sm_50\n.address_size 64\n" +
			".visible .global .align 4 .b8 secret[64];\n"))
		must(t, err)
		gp, _, err := ma.Global("secret")
		must(t, err)
		// B: a context of its own for each probe (a fault poisons it for good).
		inB := func(a device.Ptr) error {
			cb, err := b.NewContext(0)
			if err != nil {
				return err
			}
			sb, err := cb.NewStream()
			if err != nil {
				return err
			}
			return add(cb, sb, a, 16)
		}
		globalErr := inB(gp)
		// Registered host memory (a model image), read by a kernel of B at its host address.
		host, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
		must(t, err)
		must(t, b.RegisterHost(host))
		hostErr := inB(device.Ptr(uintptr(unsafe.Pointer(&host[0]))))
		// A fault of A.
		if err := add(ca, sa, 0x1000, 16); !device.IsContextFault(err) {
			t.Fatalf("process-wide %v: a kernel on a bad address: %v", processWide, err)
		}
		afterB := inB(out)
		own, err := b.NewStream(0)
		must(t, err)
		afterOwn := own.Memset8(out, 0, 64)
		if afterOwn == nil {
			afterOwn = own.Synchronize(ctx)
		}
		_, afterNew := b.NewContext(0)
		must(t, b.UnregisterHost(host))
		must(t, unix.Munmap(host))
		if processWide {
			if globalErr != nil || hostErr != nil {
				t.Errorf("process-wide: B reading A's global %v, registered host memory %v: want both to succeed",
					globalErr, hostErr)
			}
			if !errors.Is(afterB, device.ErrIllegalAddress) || !errors.Is(afterOwn, device.ErrIllegalAddress) ||
				!errors.Is(afterNew, device.ErrIllegalAddress) {
				t.Errorf("process-wide: after A's fault: B %v, the backend's stream %v, a new context %v: want each "+
					"poisoned", afterB, afterOwn, afterNew)
			}
			continue
		}
		if !device.IsContextFault(globalErr) || !device.IsContextFault(hostErr) {
			t.Errorf("per context: B reading A's global %v, registered host memory %v: want faults", globalErr, hostErr)
		}
		if afterB != nil || afterOwn != nil || afterNew != nil {
			t.Errorf("per context: after A's fault: B %v, the backend's stream %v, a new context %v", afterB, afterOwn,
				afterNew)
		}
	}
}
