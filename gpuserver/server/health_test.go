package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// mlpAnswer is one answer of the mlp driver.
type mlpAnswer struct {
	StatusCode int             `json:"statusCode"`
	Body       json.RawMessage `json:"body"`
}

// mlpInput is one row of the mlp's input.
func mlpInput() []byte {
	in := make([]float64, 1024)
	for i := range in {
		in[i] = math.Cos(float64(i) / 7)
	}
	line, _ := json.Marshal(map[string]any{"x": in})
	return line
}

// TestGPUFailureMovesTheMLPToHealthyGPUs fails the simulated GPU the mlp runs on under a request: that request
// gets a clear CUDA error and its release says the binding broke (pool.ErrGPUUnhealthy); the controller is told:
// its status shows the GPU unhealthy with nothing resident (and the metric follows), and it binds the next
// requests to healthy GPUs itself - the GPU the request holds is the one the controller counts busy, nothing is
// re-placed behind its back - where the mlp answers exactly as before. An explicit MarkUnhealthy of the next GPU
// moves it once more.
func TestGPUFailureMovesTheMLPToHealthyGPUs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the mlp in a Python process through the shim")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := startV100(ctx, t, Config{DeviceReserveBytes: 512 << 20})
	defer stop(t, s)
	p, x := s.Pool(), s.Executors()
	if err := p.Register(ctx, pool.FunctionSpec{Name: "mlp", MemoryBytes: 512 << 20}); err != nil {
		t.Fatal(err)
	}
	d := startMLP(t, s)
	line := mlpInput()
	call := func() (pool.Binding, mlpAnswer, error) {
		t.Helper()
		b, err := p.Acquire(ctx, "mlp")
		if err != nil {
			t.Fatal(err)
		}
		_ = d.Send(string(line))
		var a mlpAnswer
		d.recv(t, &a)
		return b, a, p.Release(ctx, b.ID)
	}

	b0, first, err := call()
	if err != nil || first.StatusCode != 200 {
		t.Fatalf("first request on gpu %d: %d %s (release: %v)\nstderr:\n%s", b0.GPU, first.StatusCode, first.Body,
			err, d.Stderr())
	}

	// The GPU fails under the next request, bound there: the failure shows at the request's synchronisation.
	if err := s.dev.(*sim.Backend).FailGPU(b0.GPU, errors.New("xid 48: double bit ECC error")); err != nil {
		t.Fatal(err)
	}
	b1, broken, err := call()
	if b1.GPU != b0.GPU {
		t.Fatalf("the request after the failure went to gpu %d before the failure showed; want %d", b1.GPU, b0.GPU)
	}
	if broken.StatusCode != 500 || !strings.Contains(string(broken.Body), "(46)") {
		t.Fatalf("request on the failing gpu answered %d %s, want 500 with CUDA error 46 (device unavailable)",
			broken.StatusCode, broken.Body)
	}
	if !errors.Is(err, pool.ErrGPUUnhealthy) || !errors.Is(err, executor.ErrUnhealthy) ||
		!strings.Contains(err.Error(), "broke") {
		t.Fatalf("release of the broken binding: %v, want an error saying it broke (pool.ErrGPUUnhealthy)", err)
	}
	if x.Healthy(b0.GPU) {
		t.Fatal("the executors still count the failed gpu healthy")
	}
	// The controller's own view (not the tracked pool's correction of it): unhealthy, empty, idle.
	st := s.pool.healthPool.Status(ctx)
	if g := st.GPUs[b0.GPU]; g.Healthy || len(g.Resident) != 0 || g.UsedBytes != 0 || g.Busy {
		t.Fatalf("controller status of the failed gpu: %+v", g)
	}
	if len(st.Functions) != 1 || slices.Contains(st.Functions[0].Resident, b0.GPU) {
		t.Fatalf("controller still counts the mlp resident on the failed gpu: %+v", st.Functions)
	}
	if st = p.Status(ctx); st.GPUs[b0.GPU].Healthy || len(st.GPUs[b0.GPU].Resident) != 0 {
		t.Fatalf("pool status of the failed gpu: %+v", st.GPUs[b0.GPU])
	}
	for i, g := range st.GPUs {
		if i != b0.GPU && !g.Healthy {
			t.Fatalf("gpu %d shown unhealthy", i)
		}
	}
	if m := scrape(t, s); !strings.Contains(m, fmt.Sprintf(`faas_gpu_gpu_healthy{gpu="%d"} 0`, b0.GPU)) {
		t.Fatalf("metrics do not show gpu %d unhealthy:\n%s", b0.GPU, grep(m, "faas_gpu_gpu_healthy"))
	}

	// The following requests are bound by the controller to healthy GPUs, with the same answer.
	used := map[int]bool{}
	for range 3 {
		b, a, err := call()
		if err != nil || a.StatusCode != 200 || b.GPU == b0.GPU {
			t.Fatalf("request after the failure on gpu %d: %d (release: %v)\n%.300s", b.GPU, a.StatusCode, err, a.Body)
		}
		if string(a.Body) != string(first.Body) {
			t.Fatalf("on gpu %d after the failure the mlp answered differently", b.GPU)
		}
		used[b.GPU] = true
	}
	if n := s.Replaced(); n != 0 {
		t.Errorf("%d requests were bound again: the controller placed on the failed gpu", n)
	}

	// An explicit MarkUnhealthy of the GPU it runs on now moves it again.
	var now int
	for g := range used {
		now = g
	}
	x.MarkUnhealthy(now, errors.New("operator drained the gpu"))
	for range 2 {
		b, err := p.Acquire(ctx, "mlp")
		if err != nil {
			t.Fatal(err)
		}
		// While held, the controller counts the GPU the request runs on busy, and no other.
		for _, g := range s.pool.healthPool.Status(ctx).GPUs {
			if g.Busy != (g.Index == b.GPU) {
				t.Fatalf("bound to gpu %d, controller shows gpu %d busy=%v", b.GPU, g.Index, g.Busy)
			}
		}
		_ = d.Send(string(line))
		var a mlpAnswer
		d.recv(t, &a)
		err = p.Release(ctx, b.ID)
		if err != nil || a.StatusCode != 200 || b.GPU == b0.GPU || b.GPU == now {
			t.Fatalf("request after draining gpu %d ran on gpu %d: %d (release: %v)", now, b.GPU, a.StatusCode, err)
		}
		if string(a.Body) != string(first.Body) {
			t.Fatalf("on gpu %d the mlp answered differently", b.GPU)
		}
	}
	if st := s.pool.healthPool.Status(ctx); st.GPUs[now].Healthy || len(st.GPUs[now].Resident) != 0 {
		t.Fatalf("gpu %d drained but the controller shows %+v", now, st.GPUs[now])
	}
	if n := s.Replaced(); n != 0 {
		t.Errorf("%d requests were bound again after the drain", n)
	}
}

// scrape reads the gpuserver's metrics from its socket.
func scrape(t *testing.T, s *Server) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", s.Socket())
	}}}
	resp, err := hc.Get("http://gpuserver/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

func grep(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// failingActuator is the executors' actuator with a GPU that fails under the first swap onto it: the race between
// the tracked pool asking the executors about health and the controller's decision.
type failingActuator struct {
	x     **executor.Node
	gpu   int
	fired *atomic.Bool
}

func (a failingActuator) SwapIn(ctx context.Context, function string, gpu int, from controller.Source) error {
	if gpu == a.gpu && a.fired.CompareAndSwap(false, true) {
		(*a.x).MarkUnhealthy(gpu, errors.New("xid 79: fell off the bus"))
	}
	return planeActuator{*a.x}.SwapIn(ctx, function, gpu, from)
}

func (a failingActuator) Evict(ctx context.Context, function string, gpu int) error {
	return planeActuator{*a.x}.Evict(ctx, function, gpu)
}

// TestGPUFailingUnderTheSwapIsBoundAgain: the GPU the controller chose fails while the model is swapped onto it,
// before the request holds its binding. The request is bound again by the controller, now told, on a healthy GPU
// (counted by Replaced), and the failed GPU is out of the controller's placement.
func TestGPUFailingUnderTheSwapIsBoundAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var x *executor.Node
	var fired atomic.Bool
	s := startV100(ctx, t, Config{DeviceReserveBytes: 512 << 20, Actuator: failingActuator{x: &x, gpu: 0, fired: &fired}})
	defer stop(t, s)
	x = s.Executors()
	p := s.Pool()
	if err := p.Register(ctx, pool.FunctionSpec{Name: "f", MemoryBytes: 256 << 20}); err != nil {
		t.Fatal(err)
	}
	b, err := p.Acquire(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	if !fired.Load() || b.GPU == 0 || s.Replaced() != 1 {
		t.Fatalf("binding %+v (failure injected: %v, bound again %d times), want gpu 0 to fail and the request bound "+
			"again elsewhere", b, fired.Load(), s.Replaced())
	}
	st := s.pool.healthPool.Status(ctx)
	if st.GPUs[0].Healthy || !st.GPUs[b.GPU].Busy || st.GPUs[0].Busy {
		t.Fatalf("controller after the failure under the swap: %+v", st.GPUs)
	}
	if err := p.Release(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		b, err := p.Acquire(ctx, "f")
		if err != nil || b.GPU == 0 {
			t.Fatalf("acquire after the failure: %+v %v", b, err)
		}
		if err := p.Release(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	if s.Replaced() != 1 {
		t.Fatalf("bound again %d times, want 1", s.Replaced())
	}
}
