package tenant

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenantexec"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestDataPlaneOpsReachTheirExecutors: the executor-client end of a data-plane operation reaches the executor it
// names, a process of this test binary: toTenant the tenant's (a tenant without an executor is refused with
// ErrExecutorDown), toFunction the function's (an unknown function is refused before anything is sent), toEvery
// every running one (MarkUnhealthy: each executor then reports the GPU out of service in its own status).
func TestDataPlaneOpsReachTheirExecutors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec, err := topology.Preset("v100x4")
	must(t, err)
	dev, err := sim.New(sim.Options{Node: spec})
	must(t, err)
	mem, err := memory.New(dev, memory.Config{MaxBytesPerGPU: 64 << 20})
	must(t, err)
	pl, err := New(Config{Device: dev, Memory: mem, RepositoryDir: t.TempDir(), Command: []string{os.Args[0]},
		Env: []string{tenantexec.EnvChild + "=1"}, Stderr: testWriter{t},
		Executor: handoff.Device{Kind: "sim", Sim: &handoff.SimDevice{Node: dev.Node(), Granularity: dev.GPUs()[0].Granularity}}})
	must(t, err)
	defer func() {
		must(t, pl.Close(ctx))
		must(t, mem.Close(ctx))
		must(t, dev.Close(ctx))
	}()
	must(t, pl.SetTenant(ctx, "a1", "a"))
	must(t, pl.SetTenant(ctx, "b1", "b"))

	must(t, toTenant(ctx, pl, "a", handoff.OpWaitReady, handoff.Name{Function: "a1"}))
	// b's executor does not serve a's function: the answer is its Node's.
	if err := toTenant(ctx, pl, "b", handoff.OpWaitReady, handoff.Name{Function: "a1"}); !errors.Is(err,
		executor.ErrUnknownFunction) {
		t.Fatalf("a1's op sent to tenant b: %v, want executor.ErrUnknownFunction from b's executor", err)
	}
	if err := toTenant(ctx, pl, "c", handoff.OpWaitReady, handoff.Name{Function: "a1"}); !errors.Is(err,
		ErrExecutorDown) {
		t.Fatalf("an op to a tenant without an executor: %v, want ErrExecutorDown", err)
	}
	must(t, toFunction(ctx, pl, "b1", handoff.OpWaitReady, handoff.Name{Function: "b1"}))
	if err := toFunction(ctx, pl, "z", handoff.OpWaitReady, handoff.Name{Function: "z"}); !errors.Is(err,
		executor.ErrUnknownFunction) {
		t.Fatalf("an op of an unknown function: %v", err)
	}

	must(t, toEvery(ctx, pl, handoff.OpMarkUnhealthy, handoff.MarkUnhealthy{GPU: 3, Cause: "test"}))
	sts := pl.executorStatuses()
	if len(sts) != 2 {
		t.Fatalf("%d executors answered their status, want 2", len(sts))
	}
	for i, st := range sts {
		if st.GPUs[3].Healthy || !st.GPUs[2].Healthy {
			t.Errorf("executor %d: gpu 3 healthy %v, gpu 2 healthy %v after toEvery(MarkUnhealthy gpu 3)", i,
				st.GPUs[3].Healthy, st.GPUs[2].Healthy)
		}
	}
}

// testWriter sends the executors' logs to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Logf("%s", p); return len(p), nil }
