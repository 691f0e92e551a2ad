package server

import (
	"context"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestControllerPlansWithTheDataPlanesMemory: the controller placed against each GPU's whole memory (141 GB on
// the h200 preset) while the executors' chunk pools held what the gpuserver reserved (DeviceReserveBytes, or 2 GiB
// on a simulated GPU by default), so the data plane evicted on its own what the controller planned. Now the
// gpuserver gives the controller each GPU's chunk capacity at start, in process (the executors in the gpuserver)
// and with an executor process per tenant (the gpuserver's chunks lent to them).
func TestControllerPlansWithTheDataPlanesMemory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	check := func(name string, s *Server, want uint64) {
		t.Helper()
		defer stop(t, s)
		st := s.Pool().Status(ctx)
		if len(st.GPUs) == 0 {
			t.Fatalf("%s: no GPU in the status", name)
		}
		for _, g := range st.GPUs {
			if g.MemoryBytes != want {
				t.Errorf("%s: the controller plans gpu %d with %d bytes, want the data plane's %d", name, g.Index,
					g.MemoryBytes, want)
			}
		}
	}
	check("in process, 64 MiB reserved", startOneGPU(ctx, t, Config{DeviceReserveBytes: 64 << 20}), 64<<20)
	// On a simulated GPU without a reserve named, its memory is host memory bounded by DefaultSimReserveBytes, not
	// the GPU the preset imitates: the controller keeps the preset's memory (141 GB on the h200), so that a function
	// with a quota above that bound deploys.
	check("in process, the simulated default", startOneGPU(ctx, t, Config{}), h200MemoryBytes(t))
	tc, _ := tenantConfig(t)
	check("a process per tenant, 256 MiB reserved", startV100(ctx, t, Config{DeviceReserveBytes: 256 << 20,
		Tenants: tc}), 256<<20)
}

// h200MemoryBytes is the memory of the h200x1 preset's GPU.
func h200MemoryBytes(t *testing.T) uint64 {
	t.Helper()
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	return node.GPUs[0].MemoryBytes
}
