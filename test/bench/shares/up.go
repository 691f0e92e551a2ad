package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/compute"
	"github.com/faas-gpu/faas-gpu/provider/basicauth"
	"github.com/faas-gpu/faas-gpu/test/bench/internal/benchhost"
)

// The -through-up mode: the same load as the direct mode (host work, N busy kernels, host work, per request,
// closed loop) through the product: `faas-gpu up` on the timed virtual GPU, two functions of two namespaces (two
// tenants, isolated: two executor processes) deployed with their compute shares, invoked through the gateway. Exclusive is
// the same up with --compute-sharing=false.

// spinHandler is the function: each request holds its binding for pre seconds of host work, launches n busy
// kernels of kernel_ns (modelled) on the request's GPU, synchronises, and holds it for post seconds more (the
// times in the request are wall time: modelled x the time scale).
const spinHandler = `import json, time, ctypes, os
from . import cudadrv

_here = os.path.dirname(os.path.abspath(__file__))
_cuda = cudadrv.Driver()
with open(os.path.join(_here, "kernels.ptx"), "rb") as f:
    _busy = _cuda.function(_cuda.load_module(f.read()), "busy")
_model = _cuda.alloc(1 << 20)

def _sleep(s):
    end = time.monotonic() + s
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(left)

def handle(event, context):
    body = json.loads(event.body or b"{}")
    _sleep(body.get("pre", 0))
    for _ in range(body.get("n", 0)):
        _cuda.launch(_busy, (132,), (256,), ctypes.c_uint64(body.get("kernel_ns", 0)))
    _cuda.synchronize()
    _sleep(body.get("post", 0))
    return {"statusCode": 200, "body": {"ok": True}}
`

type upRun struct {
	b        *bench
	bin      string
	root     string
	fnDir    string
	port     int
	stateDir string
	cmd      *exec.Cmd
	out      bytes.Buffer
	auth     string
	url      string
	done     chan struct{}
}

// startUp runs bin/faas-gpu up on a fresh state folder with the spin functions, sharing on or off.
func (b *bench) startUp(ctx context.Context, bin, root string, sharing bool) (*upRun, error) {
	u := &upRun{b: b, bin: bin, root: root, done: make(chan struct{})}
	base, err := os.MkdirTemp("", "shares-up-")
	if err != nil {
		return nil, err
	}
	u.stateDir, u.fnDir = filepath.Join(base, "state"), filepath.Join(base, "functions")
	for _, fn := range []string{"spin-a", "spin-b", "spin"} {
		dst := filepath.Join(u.fnDir, fn)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return nil, err
		}
		for name, src := range map[string]string{"cudadrv.py": "functions/vector-add/cudadrv.py",
			"kernels.ptx": "functions/vector-add/kernels.ptx"} {
			raw, err := os.ReadFile(filepath.Join(root, src))
			if err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(dst, name), raw, 0o644); err != nil {
				return nil, err
			}
		}
		for name, text := range map[string]string{"handler.py": spinHandler, "requirements.txt": ""} {
			if err := os.WriteFile(filepath.Join(dst, name), []byte(text), 0o644); err != nil {
				return nil, err
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	u.url = fmt.Sprintf("http://127.0.0.1:%d", u.port)
	u.cmd = exec.CommandContext(ctx, bin, "up", "--port", strconv.Itoa(u.port), "--state-dir", u.stateDir,
		"--build-dir", filepath.Join(base, "build"), "--templates-dir", filepath.Join(root, "template"),
		"--functions-dir", u.fnDir, "--shim-dir", filepath.Join(root, "shim", "build"), "--gpus", b.c.node,
		"--gpu-memory", "4Gi", "--sim-time-scale", strconv.FormatFloat(b.c.scale, 'g', -1, 64),
		"--compute-sharing="+strconv.FormatBool(sharing), "--log-level", "warn")
	u.cmd.Stdout, u.cmd.Stderr = &lockedWriter{w: &u.out}, &lockedWriter{w: &u.out}
	u.cmd.Cancel = func() error { return u.cmd.Process.Signal(syscall.SIGINT) }
	u.cmd.WaitDelay = 30 * time.Second
	if err := u.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = u.cmd.Wait(); close(u.done) }()
	if err := u.until(90*time.Second, func() error {
		resp, err := http.Get(u.url + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("healthz %d", resp.StatusCode)
		}
		return nil
	}); err != nil {
		return nil, errors.Join(err, u.stop())
	}
	creds, err := basicauth.Read(filepath.Join(u.stateDir, "secrets"))
	if err != nil {
		return nil, errors.Join(err, u.stop())
	}
	u.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(creds.User+":"+creds.Password))
	return u, nil
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (u *upRun) until(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-u.done:
			return fmt.Errorf("faas-gpu up exited: %s", u.out.String())
		default:
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (u *upRun) stop() error {
	if u.cmd.Process != nil {
		_ = u.cmd.Process.Signal(syscall.SIGINT)
	}
	select {
	case <-u.done:
	case <-time.After(40 * time.Second):
		_ = u.cmd.Process.Kill()
		<-u.done
	}
	return os.RemoveAll(filepath.Dir(u.stateDir))
}

// deploy deploys function name (its folder) as a tenant of its own (an executor process of its own) with its
// shares (request 1: exclusive).
func (u *upRun) deploy(name, folder string, request, limit float64) error {
	ann := map[string]string{"com.openfaas.gpu.memory": "64Mi", "com.openfaas.gpu.isolation": "isolated",
		"com.openfaas.gpu.slo": u.b.scaled(u.b.c.slo).String()}
	if request < 1 {
		ann["com.openfaas.gpu.compute.request"] = strconv.FormatFloat(request, 'g', -1, 64)
		ann["com.openfaas.gpu.compute.limit"] = strconv.FormatFloat(limit, 'g', -1, 64)
	}
	body, _ := json.Marshal(map[string]any{"service": name, "image": folder + ":latest",
		"envProcess": "python3 index.py", "annotations": ann, "labels": map[string]string{}})
	for _, method := range []string{http.MethodPut, http.MethodPost} {
		req, _ := http.NewRequest(method, u.url+"/system/functions", bytes.NewReader(body))
		req.Header.Set("Authorization", u.auth)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound && method == http.MethodPut {
			continue
		}
		if resp.StatusCode >= 300 {
			return fmt.Errorf("deploy %s: %d %s", name, resp.StatusCode, raw)
		}
		return nil
	}
	return nil
}

// invoke runs one request of function name; its latency is wall time.
func (u *upRun) invoke(name string) (time.Duration, error) {
	body, _ := json.Marshal(map[string]any{"pre": u.b.scaled(u.b.c.pre).Seconds(),
		"post": u.b.scaled(u.b.c.post).Seconds(), "n": u.b.c.kernels, "kernel_ns": int64(u.b.c.kernel)})
	start := time.Now()
	resp, err := http.Post(u.url+"/function/"+name, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), "ok") {
		return 0, fmt.Errorf("%s: %d %s", name, resp.StatusCode, raw)
	}
	return time.Since(start), nil
}

// upPair runs the pair through up: two functions, each a tenant of its own, closed loop, for the configured modelled time.
func (b *bench) upPair(ctx context.Context, bin, root string, shared bool) (pairResult, error) {
	u, err := b.startUp(ctx, bin, root, shared)
	if err != nil {
		return pairResult{}, err
	}
	defer func() { _ = u.stop() }()
	names := []string{"spin-a", "spin-b"}
	for _, fn := range names {
		if err := u.deploy(fn, fn, b.c.request, b.c.limit); err != nil {
			return pairResult{}, err
		}
	}
	for _, fn := range names { // started, initialised, warm
		if err := u.until(3*time.Minute, func() error { _, err := u.invoke(fn); return err }); err != nil {
			return pairResult{}, err
		}
		for range 5 {
			if _, err := u.invoke(fn); err != nil {
				return pairResult{}, err
			}
		}
	}
	lat, took, err := b.closedLoop(u, names)
	if err != nil {
		return pairResult{}, err
	}
	res := pairResult{rps: float64(len(lat[0])+len(lat[1])) / took.Seconds(), a: lat[0], b: lat[1]}
	if shared {
		res.metrics = scrapeGrants(u)
	}
	return res, nil
}

// closedLoop invokes each function in a loop of its own for the configured time; latencies and the time taken are
// modelled (wall / scale).
func (b *bench) closedLoop(u *upRun, names []string) ([]latencies, time.Duration, error) {
	end := time.Now().Add(b.scaled(time.Duration(b.c.seconds * float64(time.Second))))
	lat := make([]latencies, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	start := time.Now()
	for i, fn := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				d, err := u.invoke(fn)
				if err != nil {
					errs[i] = err
					return
				}
				lat[i] = append(lat[i], b.modelled(d))
			}
		}()
	}
	wg.Wait()
	return lat, b.modelled(time.Since(start)), errors.Join(errs...)
}

// upAlone runs one function alone through up: without a share (its stream ungated) or at request 0.5, limit 1
// (gated, with the whole GPU to grow to); its requests per second, modelled.
func (b *bench) upAlone(ctx context.Context, bin, root string, gated bool) (float64, error) {
	u, err := b.startUp(ctx, bin, root, true)
	if err != nil {
		return 0, err
	}
	defer func() { _ = u.stop() }()
	req, lim := 1.0, 1.0
	if gated {
		req = b.c.request
	}
	if err := u.deploy("spin", "spin", req, lim); err != nil {
		return 0, err
	}
	if err := u.until(3*time.Minute, func() error { _, err := u.invoke("spin"); return err }); err != nil {
		return 0, err
	}
	saved := b.c.seconds
	b.c.seconds = saved / 2
	lat, took, err := b.closedLoop(u, []string{"spin"})
	b.c.seconds = saved
	if err != nil {
		return 0, err
	}
	return float64(len(lat[0])) / took.Seconds(), nil
}

// scrapeGrants reads the gpuserver's grant counters from up's /metrics.
func scrapeGrants(u *upRun) string {
	resp, err := http.Get(u.url + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "faas_gpu_compute_grants") {
			out = append(out, l)
		}
	}
	return strings.Join(out, ", ")
}

// reportThroughUp is the report of the -through-up mode.
func (b *bench) reportThroughUp(args []string, node, gpu string, stdout io.Writer) error {
	c := b.c
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	bin, err := filepath.Abs(c.bin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("-bin: %w (make build)", err)
	}
	ctx := context.Background()
	var rep strings.Builder
	fmt.Fprintf(&rep, "# Compute shares through faas-gpu up on the timed virtual GPU\n\n")
	fmt.Fprintf(&rep, "Written by `go run ./test/bench/shares%s` (commit %s). Machine: %d CPUs (%s), load average "+
		"%s at the start. `faas-gpu up --gpus %s --sim-time-scale %g` (sim %s), one run with `--compute-sharing=false` "+
		"(exclusive), one with it on (the default); every figure is modelled time (wall time / %g), measured by the "+
		"client through the gateway.\n\n", argsLine(args), benchhost.Commit(), runtime.NumCPU(), benchhost.CPUModel(), benchhost.LoadAvg(), node,
		c.scale, gpu, c.scale)
	fmt.Fprintf(&rep, "Load: two functions, each a tenant of its own (`com.openfaas.gpu.isolation: isolated`: two "+
		"executor processes, each with its own timed virtual GPU), annotated `com.openfaas.gpu.compute.request: %g`, "+
		"`limit: %g`, SLO %v; one client each, closed loop, for %gs. A request (the gpu-python template, the shim, "+
		"the executor) holds its binding for %v of host work, %d busy kernels of %v, a synchronisation, %v of host "+
		"work.\n\n", c.request, c.limit, c.slo, c.seconds, c.pre, c.kernels, c.kernel, c.post)
	fmt.Fprintf(&rep, "| N kernels | binding | requests/s (both) | p50 a | p98 a | p50 b | p98 b | both p98 within %v | shared / exclusive |\n|---|---|---|---|---|---|---|---|---|\n", c.slo)
	var notes []string
	for _, k := range c.sweep {
		b.c.kernels = k
		excl, err := b.upPair(ctx, bin, root, false)
		if err != nil {
			return fmt.Errorf("exclusive, %d kernels: %w", k, err)
		}
		shared, err := b.upPair(ctx, bin, root, true)
		if err != nil {
			return fmt.Errorf("shared, %d kernels: %w", k, err)
		}
		for _, r := range []struct {
			name  string
			res   pairResult
			ratio string
		}{{"exclusive", excl, ""}, {fmt.Sprintf("shared %g/%g", c.request, c.limit), shared,
			fmt.Sprintf("**%.2fx**", shared.rps/excl.rps)}} {
			within := r.res.a.pct(98) <= c.slo && r.res.b.pct(98) <= c.slo
			fmt.Fprintf(&rep, "| %d | %s | %.1f | %v | %v | %v | %v | %v | %s |\n", k, r.name, r.res.rps,
				r.res.a.pct(50), r.res.a.pct(98), r.res.b.pct(50), r.res.b.pct(98), yes(within), r.ratio)
		}
		notes = append(notes, fmt.Sprintf("N = %d: %s", k, shared.metrics))
	}
	b.c.kernels = c.kernels
	fmt.Fprintf(&rep, "\nThe gpuserver's grants (one round trip per executor with a shared binding, every period of "+
		"%v wall): %s.\n\n", b.scaled(compute.DefaultPeriod), strings.Join(notes, "; "))
	fmt.Fprintf(&rep, "## What a gate costs a function alone\n\nOne function alone, %d rounds alternating no share "+
		"(ungated) and request %g, limit 1 (gated, its grants every period), %d kernels.\n\n", c.rounds, c.request,
		c.kernels)
	fmt.Fprintf(&rep, "| round | ungated requests/s | gated requests/s | gated / ungated |\n|---|---|---|---|\n")
	var sum float64
	for i := range c.rounds {
		raw, err := b.upAlone(ctx, bin, root, false)
		if err != nil {
			return err
		}
		gated, err := b.upAlone(ctx, bin, root, true)
		if err != nil {
			return err
		}
		sum += gated / raw
		fmt.Fprintf(&rep, "| %d | %.1f | %.1f | %.4f |\n", i+1, raw, gated, gated/raw)
	}
	fmt.Fprintf(&rep, "\nGated over ungated: mean %.4f over %d rounds. Load average at the end: %s.\n",
		sum/float64(c.rounds), c.rounds, benchhost.LoadAvg())
	if _, err := io.WriteString(stdout, rep.String()); err != nil {
		return err
	}
	if c.out != "" {
		return os.WriteFile(c.out, []byte(rep.String()), 0o644)
	}
	return nil
}
