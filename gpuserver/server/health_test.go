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
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
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
// gets a clear CUDA error and its release says the binding broke; the GPU is shown unhealthy (status and metric);
// the controller, which still sees the mlp resident there, binds the next requests to it, and the gpuserver
// re-places them on healthy GPUs where the mlp answers exactly as before. An explicit MarkUnhealthy of the next GPU
// moves it once more.
func TestGPUFailureMovesTheMLPToHealthyGPUs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the mlp in a Python process through the shim")
	}
	dir := t.TempDir()
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
		RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
		RepositoryDir: filepath.Join(dir, "repository"), DeviceReserveBytes: 512 << 20})
	if err != nil {
		t.Fatal(err)
	}
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
		fmt.Fprintf(d.in, "%s\n", line)
		var a mlpAnswer
		d.recv(t, &a)
		return b, a, p.Release(ctx, b.ID)
	}

	b0, first, err := call()
	if err != nil || first.StatusCode != 200 {
		t.Fatalf("first request on gpu %d: %d %s (release: %v)\nstderr:\n%s", b0.GPU, first.StatusCode, first.Body,
			err, d.stderr)
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
	if !errors.Is(err, executor.ErrUnhealthy) || !strings.Contains(err.Error(), "broke") {
		t.Fatalf("release of the broken binding: %v, want an error saying it broke (ErrUnhealthy)", err)
	}
	if x.Healthy(b0.GPU) {
		t.Fatal("the executors still count the failed gpu healthy")
	}
	st := p.Status(ctx)
	if st.GPUs[b0.GPU].Healthy || len(st.GPUs[b0.GPU].Resident) != 0 {
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

	// The following requests run elsewhere, with the same answer.
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
	if s.Replaced() == 0 {
		t.Error("no request was re-placed: the controller never bound the failed gpu again (the test proves less)")
	}

	// An explicit MarkUnhealthy of the GPU it runs on now moves it again.
	var now int
	for g := range used {
		now = g
	}
	x.MarkUnhealthy(now, errors.New("operator drained the gpu"))
	for range 2 {
		b, a, err := call()
		if err != nil || a.StatusCode != 200 || b.GPU == b0.GPU || b.GPU == now {
			t.Fatalf("request after draining gpu %d ran on gpu %d: %d (release: %v)", now, b.GPU, a.StatusCode, err)
		}
		if string(a.Body) != string(first.Body) {
			t.Fatalf("on gpu %d the mlp answered differently", b.GPU)
		}
	}
	if st := p.Status(ctx); st.GPUs[now].Healthy {
		t.Fatalf("gpu %d drained but shown healthy", now)
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
