package remoting

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// registry is a fixed set of functions and tokens.
type registry map[string]struct {
	spec  pool.FunctionSpec
	token string
}

func (r registry) Function(name string) (pool.FunctionSpec, string, error) {
	f, ok := r[name]
	if !ok {
		return pool.FunctionSpec{}, "", pool.ErrUnknownFunction
	}
	return f.spec, f.token, nil
}

// binder binds functions to GPUs the test chooses: current (a request in flight) or implicit.
type binder struct {
	mu       sync.Mutex
	current  map[string]int
	implicit int
	released int
}

func (b *binder) CurrentGPU(function string) (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	g, ok := b.current[function]
	return g, ok
}

func (b *binder) BindImplicit(_ context.Context, _ string) (int, func(), error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.implicit, func() {
		b.mu.Lock()
		b.released++
		b.mu.Unlock()
	}, nil
}

func (b *binder) bind(function string, gpu int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.current[function] = gpu
}

// shimDir builds the shim (make is incremental) and returns the directory holding libcuda.so.1.
func shimDir(t *testing.T) string { return testkit.Shim(t) }

type testServer struct {
	srv    *Server
	socket string
	binder *binder
	funcs  registry
	logs   *strings.Builder
}

// startServer runs a remoting server on a simulated v100x4 node.
func startServer(t *testing.T, funcs registry) *testServer {
	t.Helper()
	dev, xn := simNode(t, 1<<30)
	b := &binder{current: map[string]int{}}
	srv, err := NewServer(Config{Device: dev, Node: xn, Functions: funcs, Binder: b})
	if err != nil {
		t.Fatal(err)
	}
	return &testServer{srv: srv, socket: serve(t, srv), binder: b, funcs: funcs}
}

// serve runs srv on a new Unix socket, whose path it returns, until the test ends.
func serve(t *testing.T, srv *Server) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "remoting.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return sock
}

// pyDriver runs a function's handler.py in a Python process with the shim as libcuda.so.1, one JSON request per
// line on stdin, one JSON result per line on stdout.
type pyDriver struct {
	*testkit.Python
}

const driverPy = `
import json, os, sys, array
sys.path.insert(0, os.environ["FN_PARENT"])
from function import handler
class Event:
    def __init__(self, body):
        self.body, self.headers, self.method, self.query, self.path = body, {}, "POST", {}, "/"
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if req.get("reference") is not None:
        out = {"y": handler.reference(array.array("f", req["reference"]))}
    else:
        out = handler.handle(Event(json.dumps(req["body"]).encode()), None)
    print(json.dumps(out), flush=True)
`

func startFunction(t *testing.T, s *testServer, fn, dir string, env ...string) *pyDriver {
	t.Helper()
	testkit.NeedPython(t)
	lib := shimDir(t)
	parent := t.TempDir()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(abs, filepath.Join(parent, "function")); err != nil {
		t.Fatal(err)
	}
	env = append(append(testkit.ShimEnv(lib, s.socket, fn, s.funcs[fn].token), "FN_PARENT="+parent), env...)
	d := &pyDriver{testkit.StartPython(t, driverPy, env...)}
	var ready map[string]any
	d.recv(t, &ready)
	return d
}

func (d *pyDriver) recv(t *testing.T, v any) {
	t.Helper()
	line := d.Next()
	if err := json.Unmarshal([]byte(line), v); err != nil {
		t.Fatalf("bad output %q: %v", line, err)
	}
}

type fnResult struct {
	StatusCode int                  `json:"statusCode"`
	Body       map[string]any       `json:"body"`
	Y          []float64            `json:"y"`
	Raw        map[string][]byte    `json:"-"`
	Vec        map[string][]float64 `json:"-"`
}

func (d *pyDriver) call(t *testing.T, body any) fnResult {
	t.Helper()
	line, _ := json.Marshal(map[string]any{"body": body})
	if err := d.Send(string(line)); err != nil {
		t.Fatal(err)
	}
	var r fnResult
	d.recv(t, &r)
	return r
}

func floats(t *testing.T, v any) []float64 {
	t.Helper()
	l, ok := v.([]any)
	if !ok {
		t.Fatalf("not a list: %T", v)
	}
	out := make([]float64, len(l))
	for i, x := range l {
		out[i] = x.(float64)
	}
	return out
}

func TestVectorAddEndToEnd(t *testing.T) {
	s := startServer(t, registry{"vector-add": {pool.FunctionSpec{Name: "vector-add", MemoryBytes: 256 << 20}, "tok-va"}})
	d := startFunction(t, s, "vector-add", "../../functions/vector-add")
	for _, n := range []int{1, 1000, 300000} {
		a, b := make([]float32, n), make([]float32, n)
		for i := range a {
			a[i], b[i] = float32(i)*0.5, float32(n-i)*0.25
		}
		s.binder.bind("vector-add", n%4)
		r := d.call(t, map[string]any{"a": a, "b": b})
		if r.StatusCode != 200 {
			t.Fatalf("n=%d: status %d: %v", n, r.StatusCode, r.Body)
		}
		c := floats(t, r.Body["c"])
		if len(c) != n {
			t.Fatalf("n=%d: %d results", n, len(c))
		}
		for i := range c {
			if want := float64(a[i] + b[i]); c[i] != want {
				t.Fatalf("n=%d: c[%d] = %v, want %v", n, i, c[i], want)
			}
		}
	}
	r := d.call(t, map[string]any{"a": []float32{1, 2}, "b": []float32{1}})
	if r.StatusCode != 400 || !strings.Contains(fmt.Sprint(r.Body["error"]), "b:") {
		t.Fatalf("unequal lengths: status %d %v", r.StatusCode, r.Body)
	}
	// Three sums, each with two copies in, a launch and a copy out: the records are counted. Between requests
	// the function decodes JSON for far longer than the spin time, so its session sleeps on the socket.
	if st := s.srv.Stats(); st.Records < 3*4 {
		t.Errorf("%d records counted, want at least 12", st.Records)
	}
	testkit.Eventually(t, 60*time.Second, "the session sleeps between requests", func() bool { return s.srv.Stats().Sleeps > 0 })
}

// TestMLPSameOutputOnEveryGPU runs the mlp on GPUs 0..3 in turn (its 155 MB of weights move with it) and checks
// every output against the pure-Python reference.
func TestMLPSameOutputOnEveryGPU(t *testing.T) {
	if testing.Short() {
		t.Skip("mlp end to end takes a few seconds")
	}
	s := startServer(t, registry{"mlp": {pool.FunctionSpec{Name: "mlp", MemoryBytes: 512 << 20}, "tok-mlp"}})
	d := startFunction(t, s, "mlp", "../../functions/mlp")
	x := make([]float32, 1024)
	for i := range x {
		x[i] = float32(math.Sin(float64(i)))
	}
	var first []float64
	for _, gpu := range []int{2, 0, 3, 2} {
		s.binder.bind("mlp", gpu)
		r := d.call(t, map[string]any{"x": x})
		if r.StatusCode != 200 {
			t.Fatalf("gpu %d: status %d: %v", gpu, r.StatusCode, r.Body)
		}
		y := floats(t, r.Body["y"])
		if first == nil {
			first = y
			continue
		}
		for i := range y {
			if y[i] != first[i] {
				t.Fatalf("gpu %d: y[%d] = %v, first run %v", gpu, i, y[i], first[i])
			}
		}
	}
	line, _ := json.Marshal(map[string]any{"reference": x})
	_ = d.Send(string(line))
	var ref fnResult
	d.recv(t, &ref)
	if len(ref.Y) != len(first) || len(first) != 256 {
		t.Fatalf("reference has %d values, device %d", len(ref.Y), len(first))
	}
	for i := range first {
		if math.Abs(first[i]-ref.Y[i]) > 1e-3*math.Max(1, math.Abs(ref.Y[i])) {
			t.Fatalf("y[%d] = %v, reference %v", i, first[i], ref.Y[i])
		}
	}
}

const isolationPy = `
import ctypes, os, sys
sys.path.insert(0, os.environ["FN_DIR"])
import cudadrv
cuda = cudadrv.Driver()
p = cuda.alloc(4096)
cuda.htod(p, b"secret of A" + bytes(4096 - 11))
print(p, flush=True)
if os.environ.get("VICTIM_PTR"):
    victim = int(os.environ["VICTIM_PTR"])
    for attempt in ("dtoh", "htod"):
        try:
            if attempt == "dtoh":
                cuda.dtoh(victim, 16)
            else:
                cuda.htod(victim, b"overwrite")
            print("allowed", attempt, flush=True)
        except cudadrv.CudaError as e:
            print("refused", attempt, e.code, flush=True)
    cuda.htod(p, b"B still works")
    print(cuda.dtoh(p, 13).decode(), flush=True)
else:
    sys.stdin.readline()
    print(cuda.dtoh(p, 11).decode(), flush=True)
`

// TestIsolation: function B cannot copy from or to function A's memory, and keeps working afterwards.
func TestIsolation(t *testing.T) {
	s := startServer(t, registry{
		"a": {pool.FunctionSpec{Name: "a", MemoryBytes: 64 << 20}, "tok-a"},
		"b": {pool.FunctionSpec{Name: "b", MemoryBytes: 64 << 20}, "tok-b"},
	})
	lib := shimDir(t)
	env := func(fn, tok string) []string {
		return append(os.Environ(), "LD_LIBRARY_PATH="+lib, "FN_DIR=../../functions/vector-add",
			"FAAS_GPU_REMOTING_SOCKET="+s.socket, "FAAS_GPU_FUNCTION="+fn, "FAAS_GPU_TOKEN="+tok)
	}
	a := exec.Command("python3", "-c", isolationPy)
	a.Env = env("a", "tok-a")
	ain, _ := a.StdinPipe()
	aout, _ := a.StdoutPipe()
	var aerr strings.Builder
	a.Stderr = &aerr
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ain.Close(); _ = a.Wait() }()
	as := bufio.NewScanner(aout)
	if !as.Scan() {
		t.Fatalf("a: %s", aerr.String())
	}
	ptr := as.Text()

	b := exec.Command("python3", "-c", isolationPy)
	b.Env = append(env("b", "tok-b"), "VICTIM_PTR="+ptr)
	out, err := b.CombinedOutput()
	if err != nil {
		t.Fatalf("b: %v\n%s", err, out)
	}
	got := string(out)
	for _, want := range []string{"refused dtoh 1", "refused htod 1", "B still works"} {
		if !strings.Contains(got, want) {
			t.Errorf("b's output lacks %q:\n%s", want, got)
		}
	}
	if _, err := fmt.Fprintln(ain, "go"); err != nil {
		t.Fatal(err)
	}
	if !as.Scan() || as.Text() != "secret of A" {
		t.Fatalf("a's memory changed: %q %s", as.Text(), aerr.String())
	}
}

// hello builds a raw hello with the given version and a sealed memfd of the shim's layout.
func rawHello(t *testing.T, sock string, major, minor uint16, fn, token string) (reply []byte) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := make([]byte, wireHelloSize)
	binary.LittleEndian.PutUint32(b, wireMagic)
	binary.LittleEndian.PutUint16(b[4:], major)
	binary.LittleEndian.PutUint16(b[6:], minor)
	copy(b[wireHelloFunction:], fn)
	copy(b[wireHelloToken:], token)
	if _, _, err := c.(*net.UnixConn).WriteMsgUnix(b, nil, nil); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	reply = make([]byte, wireReplySize)
	if _, err := io.ReadFull(c, reply); err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	// The server closes the connection after a refusal.
	if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("connection still open after a refusal: %d %v", n, err)
	}
	return reply
}

func TestVersionMismatchRefused(t *testing.T) {
	s := startServer(t, registry{"f": {pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20}, "tok"}})
	for _, v := range [][2]uint16{{wireVersionMajor + 1, 0}, {wireVersionMajor, wireVersionMinor + 1}, {0, 0}} {
		r := rawHello(t, s.socket, v[0], v[1], "f", "tok")
		status := int32(binary.LittleEndian.Uint32(r[wireReplyStatus:]))
		msg := cstring(r[wireReplyMessage:])
		if binary.LittleEndian.Uint32(r) != wireMagic || status != wireStatusVersion {
			t.Fatalf("version %d.%d: status %d", v[0], v[1], status)
		}
		if want := fmt.Sprintf("shim speaks %d.%d, gpuserver speaks %d.%d", v[0], v[1], wireVersionMajor,
			wireVersionMinor); !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	r := rawHello(t, s.socket, wireVersionMajor, wireVersionMinor, "f", "wrong")
	if st := int32(binary.LittleEndian.Uint32(r[wireReplyStatus:])); st != wireStatusIdentity {
		t.Errorf("wrong token: status %d", st)
	}
	r = rawHello(t, s.socket, wireVersionMajor, wireVersionMinor, "f", "tok")
	if st := int32(binary.LittleEndian.Uint32(r[wireReplyStatus:])); st != wireStatusSharedMemory {
		t.Errorf("no memfd: status %d", st)
	}
}
