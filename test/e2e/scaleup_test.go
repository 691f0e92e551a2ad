package e2e

import (
	"crypto/sha3"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// mlpHostReference is functions/mlp's forward pass of one row x with dims and seed, on the host in float64.
func mlpHostReference(dims []int, seed string, x []float64) []float64 {
	row := x
	for l := range len(dims) - 1 {
		k, n := dims[l], dims[l+1]
		weights := func(layer, count int) []float64 {
			raw := make([]byte, 4*count)
			h := sha3.NewSHAKE256()
			_, _ = h.Write([]byte(fmt.Sprintf("%s/%d", seed, layer)))
			_, _ = h.Read(raw)
			out := make([]float64, count)
			for i := range out {
				raw[4*i+3] = raw[4*i+3]&0x80 | 0x3C
				out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])))
			}
			return out
		}
		w, b := weights(2*l, k*n), weights(2*l+1, n)
		out := append([]float64(nil), b...)
		for kk := range k {
			for j := range n {
				out[j] += row[kk] * w[kk*n+j]
			}
		}
		if l < len(dims)-2 {
			for j := range out {
				out[j] = max(out[j], 0)
			}
		}
		row = out
	}
	return row
}

// TestUpScaleUpAndRollNeverAnswerZeros is the scale-up attack of hardening round three through `faas-gpu up`, for
// every scratch mode: the mlp is deployed and called, scaled to three replicas while it is called, rolled (an
// update replaces every replica while it is called) and called again; every answer must be 200 and equal the
// first, which must match the host's reference. Before, with com.openfaas.gpu.scratch: request, the replicas that
// started after the first request answered zeros with 200 (6 of 12 answers wrong).
func TestUpScaleUpAndRollNeverAnswerZeros(t *testing.T) {
	if testing.Short() {
		t.Skip("runs faas-gpu up with GPU functions")
	}
	testkit.NeedPython(t)
	in := startUp(t, filepath.Join(t.TempDir(), "state"))
	dims := []int{256, 512, 512, 64}
	x := make([]float64, dims[0])
	for i := range x {
		x[i] = math.Cos(float64(i)/9) / 2
	}
	body, _ := json.Marshal(map[string]any{"x": x})
	for _, mode := range []string{"resident", "request"} {
		t.Run(mode, func(t *testing.T) {
			name, seed := "mlp", "roll-"+mode // up finds the build context by the function's name
			fn := types.FunctionDeployment{Service: name, Image: "mlp:latest",
				EnvVars: map[string]string{"MLP_DIMS": "256,512,512,64", "MLP_SEED": seed},
				Annotations: &map[string]string{"com.openfaas.gpu.memory": "64Mi",
					"com.openfaas.gpu.scratch": mode}}
			deploy(t, in, fn)
			url := in.url + "/function/" + name
			var first []float64
			if err := json.Unmarshal([]byte(invokeReady(t, url, string(body))), &struct{ Y *[]float64 }{&first}); err != nil {
				t.Fatal(err)
			}
			want := mlpHostReference(dims, seed, x)
			if len(first) != len(want) {
				t.Fatalf("first answer has %d values, want %d", len(first), len(want))
			}
			for j := range want {
				if math.Abs(first[j]-want[j]) > 1e-4*(1+math.Abs(want[j])) {
					t.Fatalf("first answer y[%d] = %v, the host computes %v", j, first[j], want[j])
				}
			}
			var answers, wrong atomic.Int64
			var example atomic.Value
			check := func() {
				r := call(t, http.MethodPost, url, string(body), nil)
				answers.Add(1)
				var a struct{ Y []float64 }
				if r.code != http.StatusOK {
					return // a replica still starting may answer 503: never a wrong 200
				}
				if json.Unmarshal([]byte(r.body), &a) != nil || len(a.Y) != len(first) {
					wrong.Add(1)
					example.Store(fmt.Sprintf("%d %.200s", r.code, r.body))
					return
				}
				for j := range a.Y {
					if a.Y[j] != first[j] {
						wrong.Add(1)
						example.Store(fmt.Sprintf("y[%d] = %v, the first answer was %v", j, a.Y[j], first[j]))
						return
					}
				}
			}
			// Calls while the function scales up and rolls, so that new replicas initialise beside requests.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
						check()
					}
				}
			}()
			replicas := func(n uint64) {
				testkit.EventuallyNil(t, 90*time.Second, fmt.Sprintf("%s at %d ready replicas", name, n), func() error {
					if st := functionStatus(t, in, name); st.AvailableReplicas != n {
						return fmt.Errorf("status %+v", st)
					}
					return nil
				})
			}
			if r := in.system(t, http.MethodPost, "/system/scale-function/"+name,
				types.ScaleServiceRequest{ServiceName: name, Replicas: 3}); r.code >= 300 {
				t.Fatalf("scale: %d %s", r.code, r.body)
			}
			replicas(3)
			for range 12 {
				check()
			}
			fn.EnvVars["ROLLED"] = "1" // an update: every replica is replaced
			deploy(t, in, fn)
			testkit.EventuallyNil(t, 90*time.Second, name+" rolled", func() error {
				if st := functionStatus(t, in, name); st.EnvVars["ROLLED"] != "1" || st.AvailableReplicas == 0 {
					return fmt.Errorf("status %+v", st)
				}
				return nil
			})
			for range 12 {
				check()
			}
			close(stop)
			wg.Wait()
			if wrong.Load() > 0 {
				t.Fatalf("%d of %d answers wrong with 200, e.g. %v", wrong.Load(), answers.Load(), example.Load())
			}
			t.Logf("%d answers during and after the scale-up and the roll, all equal to the first", answers.Load())
			if r := in.system(t, http.MethodDelete, "/system/functions",
				types.DeleteFunctionRequest{FunctionName: name}); r.code >= 300 {
				t.Fatalf("delete: %d %s", r.code, r.body)
			}
		})
	}
}
