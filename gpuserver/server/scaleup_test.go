package server

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// scaleUpDims size the replicas of TestReplicasStartedAfterTheFirstRequestAnswerRight: weights of 1, 4 and 1 MiB
// and the small blocks, 6 chunks of 2 MiB a replica; three replicas fit the quota and a GPU of 64 MiB.
const scaleUpDims, scaleUpQuota = "256,1024,1024,256,64", 48 << 20

// TestReplicasStartedAfterTheFirstRequestAnswerRight scales a function up and rolls it after its first request,
// under every scratch mode, through the pool, the executors, the gpu-python template with the mlp example and the
// real shim. Replica a initialises and answers the function's first request; replica b starts (a scale-up) and
// initialises outside any request; replica c (a rolling update's new process, or a scale-up under load)
// initialises while a request of the function is in flight, so its calls run under that request's binding; then
// a ends. Between rounds the function is evicted, so every replica comes back from host memory. Every answer of
// every replica must equal the first, which must match the host's reference. Before, the blocks a later replica
// allocated in its initialisation were scratch: with scratch per request they were given back at the end of the
// next binding and mapped zeroed, and b and c answered zeros with 200.
func TestReplicasStartedAfterTheFirstRequestAnswerRight(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the template's Python processes through the shim")
	}
	testkit.NeedPython(t)
	testkit.Shim(t)
	var dims []int
	for _, d := range strings.Split(scaleUpDims, ",") {
		v, _ := strconv.Atoi(d)
		dims = append(dims, v)
	}
	x := make([]float64, dims[0])
	for i := range x {
		x[i] = math.Sin(float64(i)/5) / 2
	}
	body, _ := json.Marshal(map[string]any{"x": x})
	for _, mode := range []string{pool.ScratchResident, pool.ScratchRequest} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			node, err := topology.Preset("v100x4")
			if err != nil {
				t.Fatal(err)
			}
			if node, err = node.WithGPUMemory(64 << 20); err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			s, err := Start(ctx, Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
				RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
				RepositoryDir: filepath.Join(dir, "repository"), DeviceReserveBytes: 64 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer stop(t, s)
			fn := "scaled-" + mode
			if err := s.Pool().Register(ctx, pool.FunctionSpec{Name: fn, MemoryBytes: scaleUpQuota,
				Scratch: mode}); err != nil {
				t.Fatal(err)
			}
			seed := "scale-" + mode
			start := func() *templateFunction {
				return startTemplateFunction(t, s, fn, "../../functions/mlp", "MLP_DIMS="+scaleUpDims,
					"MLP_SEED="+seed)
			}
			want := mlpReference(dims, seed, x)
			var first []float64
			answers := 0
			call := func(what string, f *templateFunction) {
				t.Helper()
				code, out := f.post(t, body)
				var a struct {
					Y []float64 `json:"y"`
				}
				if code != http.StatusOK || json.Unmarshal(out, &a) != nil || len(a.Y) != len(want) {
					t.Fatalf("%s: %d %.300s\n%s", what, code, out, f.stderr)
				}
				answers++
				if first == nil {
					for j := range want {
						if math.Abs(a.Y[j]-want[j]) > 1e-4*(1+math.Abs(want[j])) {
							t.Fatalf("%s: first answer y[%d] = %v, the host computes %v (%d of %d values zero)", what,
								j, a.Y[j], want[j], zeroCount(a.Y), len(a.Y))
						}
					}
					first = a.Y
					return
				}
				for j := range a.Y {
					if a.Y[j] != first[j] {
						t.Fatalf("%s (answer %d): y[%d] = %v, the first answer was %v (%d of %d values zero)", what,
							answers, j, a.Y[j], first[j], zeroCount(a.Y), len(a.Y))
					}
				}
			}
			evict := func() {
				t.Helper()
				gpus, _, err := s.Executors().Resident(fn)
				if err != nil {
					t.Fatal(err)
				}
				for _, g := range gpus {
					if err := s.Executors().Evict(ctx, fn, g); err != nil {
						t.Fatalf("evict from gpu %d: %v", g, err)
					}
				}
			}

			a := start()
			call("a, the first request", a)
			call("a, the second request", a)

			b := start() // scaled up after the first request, nothing in flight
			for round := range 2 {
				call(fmt.Sprintf("round %d: b", round), b)
				call(fmt.Sprintf("round %d: a", round), a)
				call(fmt.Sprintf("round %d: b again", round), b)
				evict()
			}

			// c initialises while a request of the function holds a binding: its calls run under it.
			held, err := s.Pool().Acquire(ctx, fn)
			if err != nil {
				t.Fatal(err)
			}
			c := start()
			if err := s.Pool().Release(ctx, held.ID); err != nil {
				t.Fatal(err)
			}
			_ = a.cmd.Process.Kill() // the rolling update ends the old replica
			<-a.exited
			for round := range 3 {
				call(fmt.Sprintf("round %d after the roll: c", round), c)
				call(fmt.Sprintf("round %d after the roll: b", round), b)
				call(fmt.Sprintf("round %d after the roll: c again", round), c)
				evict()
			}
			if st := s.Executors().Images(); st.Captures != 1 {
				t.Fatalf("image stats %+v: want one capture", st)
			}
			t.Logf("%d answers, all equal to the first; image stats %+v", answers, s.Executors().Images())
		})
	}
}
