package sim_test

import (
	"context"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
)

// A stream measures the GPU time its compute work occupies (what compute shares are counted in): kernels, memsets
// and local copies, in modelled time scaled as the clock is; copies over links are not compute.
func TestStreamMetersItsComputeWork(t *testing.T) {
	ctx := context.Background()
	clk := &fakeClock{now: time.Unix(1000, 0)}
	b := newSim(t, sim.Options{Clock: clk, TimeScale: 2})
	busy := busyKernel(t, b, 0)
	s, err := b.NewStream(0)
	must(t, err)
	other, err := b.NewStream(0)
	must(t, err)
	m, ok := s.(device.ComputeMeter)
	if !ok {
		t.Fatal("a sim stream is no device.ComputeMeter")
	}
	ptr := mapOn(t, b, 0, 2<<20)
	must(t, s.Launch(busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, busyArgs(100*time.Microsecond)))
	must(t, other.Launch(busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, busyArgs(300*time.Microsecond)))
	must(t, s.Launch(busy, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, busyArgs(50*time.Microsecond)))
	must(t, s.CopyHtoD(ptr, make([]byte, 4096)))
	must(t, s.Memset8(ptr, 0, 1<<20))
	must(t, s.Synchronize(ctx))
	ops, work := m.ComputeWork()
	bw := 900e9 // the default memory bandwidth
	memset := 2 * time.Duration(float64(1<<20)/bw*1e9)
	if want := 2*150*time.Microsecond + memset; ops != 3 || work < want-time.Microsecond || work > want+time.Microsecond {
		t.Fatalf("ComputeWork = %d ops, %v; want 3 ops (two kernels, a memset; not the copy nor the other stream's "+
			"kernel), %v (scaled by 2)", ops, work, want)
	}
}
