package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha3"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// mlpReference is functions/mlp's forward pass of one row x, computed on the host in float64 from the weights
// the handler derives from seed (SHAKE-256 bytes with a fixed exponent).
func mlpReference(dims []int, seed string, x []float64) []float64 {
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
	row := x
	for l := range len(dims) - 1 {
		k, n := dims[l], dims[l+1]
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

// templateFunction is a function process as the local backend runs it: the gpu-python template's index.py
// serving a handler over HTTP, each request wrapped in acquire/release against the gpuserver, CUDA through the
// shim.
type templateFunction struct {
	cmd    *exec.Cmd
	url    string
	stderr *testkit.Buffer
	exited chan struct{}
}

func startTemplateFunction(t *testing.T, s *Server, name, handlerDir string, env ...string) *templateFunction {
	t.Helper()
	dir := t.TempDir()
	index, err := os.ReadFile("../../template/gpu-python/index.py")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "index.py"), index, 0o644); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(handlerDir)
	if err := os.Symlink(abs, filepath.Join(dir, "function")); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	shim, _ := filepath.Abs("../../shim/build")
	cmd := exec.Command("python3", "index.py")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"PORT=" + strconv.Itoa(port), "FAAS_GPU=1",
		"FAAS_GPU_FUNCTION=" + name, "FAAS_GPU_TOKEN=" + s.Token(name), "FAAS_GPU_SOCKET=" + s.Socket(),
		"FAAS_GPU_REMOTING_SOCKET=" + s.RemotingSocket(), "LD_LIBRARY_PATH=" + shim, "PYTHONDONTWRITEBYTECODE=1"},
		env...)...)
	f := &templateFunction{cmd: cmd, url: fmt.Sprintf("http://127.0.0.1:%d/", port), stderr: &testkit.Buffer{},
		exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = f.stderr, f.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(f.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-f.exited
	})
	testkit.Eventually(t, 60*time.Second, name+" healthy", func() bool {
		select {
		case <-f.exited:
			t.Fatalf("%s exited at start: %v\n%s", name, cmd.ProcessState, f.stderr)
		default:
		}
		resp, err := http.Get(f.url + "_/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return f
}

func (f *templateFunction) post(t *testing.T, body []byte) (int, []byte) {
	t.Helper()
	resp, err := http.Post(f.url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("invoke: %v\n%s", err, f.stderr)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// TestNeighbourFaultBeforeFirstRequest: on a node of one GPU, the mlp (the gpu-python template with the example
// handler, through the shim) finishes its initialisation, then a neighbour of its namespace launches a kernel on
// a bad address before the mlp's first request. The fault tears down the namespace's context on the GPU, and with
// it the mlp's memory, which has no image yet. The mlp's next request answers 503 (never 200, never a 500 forever):
// the gpuserver says its process must start again, the template exits so that its supervisor restarts it, and the
// new process initialises afresh and answers exactly. Before, the mlp answered 500 ("has model blocks but is
// active on no gpu") until it was redeployed.
func TestNeighbourFaultBeforeFirstRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python processes through the shim")
	}
	testkit.NeedPython(t)
	testkit.Shim(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node, err := topology.Preset("h200x1")
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
	p := s.Pool()
	for _, name := range []string{"mlp", "va"} {
		if err := p.Register(ctx, pool.FunctionSpec{Name: name, MemoryBytes: 16 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	dims := []int{256, 1024, 256, 64}
	const seed = "neighbour"
	env := []string{"MLP_DIMS=256,1024,256,64", "MLP_SEED=" + seed}
	mlp := startTemplateFunction(t, s, "mlp", "../../functions/mlp", env...)

	// The neighbour faults on the mlp's GPU before the mlp's first request.
	va := startFaulty(t, s, "va")
	b, err := p.Acquire(ctx, "va")
	if err != nil {
		t.Fatal(err)
	}
	if l := va.send(t, "bad"); !strings.HasPrefix(l, "fault 700") {
		t.Fatalf("the neighbour's bad kernel: %q", l)
	}
	if err := p.Release(ctx, b.ID); !errors.Is(err, pool.ErrBindingBroken) {
		t.Fatalf("release of the faulting binding: %v, want ErrBindingBroken", err)
	}

	x := make([]float64, dims[0])
	for i := range x {
		x[i] = math.Cos(float64(i) / 7)
	}
	body, _ := json.Marshal(map[string]any{"x": x})
	code, out := mlp.post(t, body)
	if code != http.StatusServiceUnavailable {
		t.Fatalf("the mlp's first request after its memory was lost: %d %s, want 503\n%s", code, out, mlp.stderr)
	}
	select {
	case <-mlp.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the mlp's process did not exit to start again\n%s", mlp.stderr)
	}
	if c := mlp.cmd.ProcessState.ExitCode(); c != 75 {
		t.Fatalf("the mlp's process exited with %d, want 75 (start again)\n%s", c, mlp.stderr)
	}
	// Its supervisor starts it again once its last session ended (its memory forgotten).
	testkit.Eventually(t, 60*time.Second, "the mlp's memory forgotten", func() bool {
		segs, err := s.Executors().Segments("mlp")
		return err == nil && len(segs) == 0
	})
	mlp = startTemplateFunction(t, s, "mlp", "../../functions/mlp", env...)
	want := mlpReference(dims, seed, x)
	for range 2 {
		code, out = mlp.post(t, body)
		var a struct {
			Y []float64 `json:"y"`
		}
		if code != http.StatusOK || json.Unmarshal(out, &a) != nil || len(a.Y) != len(want) {
			t.Fatalf("the restarted mlp answered %d %.300s\n%s", code, out, mlp.stderr)
		}
		for j := range want {
			if math.Abs(a.Y[j]-want[j]) > 1e-4*(1+math.Abs(want[j])) {
				t.Fatalf("the restarted mlp: y[%d] = %v, the host computes %v", j, a.Y[j], want[j])
			}
		}
	}
}

// faultyFunction is faultyPy through the shim: "good" computes with its model, "bad" launches a kernel on a bad
// address.
type faultyFunction struct {
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *strings.Builder
}

func startFaulty(t *testing.T, s *Server, name string) *faultyFunction {
	t.Helper()
	shim, _ := filepath.Abs("../../shim/build")
	fn, _ := filepath.Abs("../../functions/vector-add")
	cmd := exec.Command("python3", "-c", faultyPy)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+shim, "FN_DIR="+fn, "FAAS_GPU_REMOTING_SOCKET="+s.RemotingSocket(),
		"FAAS_GPU_FUNCTION="+name, "FAAS_GPU_TOKEN="+s.Token(name), "PYTHONDONTWRITEBYTECODE=1")
	f := &faultyFunction{stderr: &strings.Builder{}}
	cmd.Stderr = f.stderr
	f.in, _ = cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.in.Close(); _ = cmd.Wait() })
	f.out = bufio.NewScanner(stdout)
	if l := f.line(t); l != "ready" {
		t.Fatalf("%s said %q\n%s", name, l, f.stderr)
	}
	return f
}

func (f *faultyFunction) line(t *testing.T) string {
	t.Helper()
	if !f.out.Scan() {
		t.Fatalf("the function process ended: %v\n%s", f.out.Err(), f.stderr)
	}
	return f.out.Text()
}

func (f *faultyFunction) send(t *testing.T, what string) string {
	t.Helper()
	fmt.Fprintln(f.in, what)
	return f.line(t)
}
