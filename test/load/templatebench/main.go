// Command templatebench measures the gpu-python template under a burst of concurrent requests, the way users call
// a function: real function processes (the echo example from template/gpu-python, run by the local backend) behind
// the provider's proxy (provider/handlers) on a real HTTP server, driven by many concurrent clients. It compares,
// side by side in one run, the listen backlog of the standard library (5, what the template had) with the
// template's default, and writes the figures and the conditions to a Markdown file.
//
//	go run ./test/load/templatebench -out docs/bench/template.md [-concurrency 200] [-duration 20s]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider/handlers"
	"github.com/faas-gpu/faas-gpu/provider/local"
	"github.com/faas-gpu/faas-gpu/provider/shrinkwrap"
)

type variant struct {
	name    string
	backlog string // FAAS_GPU_LISTEN_BACKLOG; empty: the template's default
}

type result struct {
	variant   variant
	requests  int
	ok        int
	codes     map[int]int
	errs      map[string]int
	latencies []time.Duration
	elapsed   time.Duration
}

func main() {
	out := flag.String("out", "docs/bench/template.md", "Markdown file to write")
	concurrency := flag.Int("concurrency", 200, "concurrent clients")
	duration := flag.Duration("duration", 20*time.Second, "how long each variant runs")
	newConn := flag.Bool("new-connections", true, "each request on a new client connection (as many load tools and browsers do)")
	flag.Parse()
	if *concurrency < 1 || *duration <= 0 {
		fmt.Fprintln(os.Stderr, "templatebench: -concurrency and -duration must be positive")
		os.Exit(2)
	}
	if err := run(*out, *concurrency, *duration, *newConn); err != nil {
		fmt.Fprintln(os.Stderr, "templatebench:", err)
		os.Exit(1)
	}
}

func run(out string, concurrency int, duration time.Duration, newConn bool) error {
	started := time.Now()
	load0 := loadavg()
	work, err := os.MkdirTemp("", "templatebench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	build := filepath.Join(work, "build")
	if err := shrinkwrap.Assemble(filepath.Join("template", "gpu-python"), filepath.Join("functions", "echo"),
		filepath.Join(build, "echo")); err != nil {
		return fmt.Errorf("run from the repository root: %w", err)
	}
	variants := []variant{{"backlog 5 (the standard library's, before)", "5"}, {"backlog 1024 (the template's default, after)", ""}}
	var results []result
	for i, v := range variants {
		r, err := measure(filepath.Join(work, fmt.Sprintf("state-%d", i)), build, v, concurrency, duration, newConn)
		if err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
		results = append(results, r)
		fmt.Printf("%s: %d requests, %d 2xx, codes %v, errors %v\n", v.name, r.requests, r.ok, r.codes, r.errs)
	}
	return write(out, results, concurrency, duration, newConn, started, load0)
}

func measure(state, build string, v variant, concurrency int, duration time.Duration, newConn bool) (result, error) {
	ctx := context.Background()
	env := map[string]string{}
	if v.backlog != "" {
		env["FAAS_GPU_LISTEN_BACKLOG"] = v.backlog
	}
	b, err := local.New(ctx, local.Config{StateDir: state, BuildDir: build, Env: env,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return result{}, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = b.Close(cctx)
	}()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{}, err
	}
	srv := &http.Server{Handler: handlers.New(handlers.Config{Backend: b, ProxyTimeout: time.Minute,
		ReadyTimeout: time.Minute})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	if err := b.Deploy(ctx, types.FunctionDeployment{Service: "echo", Image: "echo:latest"}); err != nil {
		return result{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	_, done, err := b.Route(rctx, "", "echo")
	cancel()
	if err != nil {
		return result{}, err
	}
	done()
	url := "http://" + l.Addr().String() + "/function/echo"
	r := result{variant: v, codes: map[int]int{}, errs: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(duration)
	for c := 0; c < concurrency; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: newConn,
				MaxIdleConnsPerHost: 1}}
			var lat []time.Duration
			codes, errs, ok := map[int]int{}, map[string]int{}, 0
			for time.Now().Before(end) {
				t0 := time.Now()
				resp, err := client.Post(url, "text/plain", strings.NewReader("hello"))
				if err != nil {
					errs[errClass(err)]++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat = append(lat, time.Since(t0))
				codes[resp.StatusCode]++
				if resp.StatusCode < 300 {
					ok++
				}
			}
			mu.Lock()
			defer mu.Unlock()
			r.latencies = append(r.latencies, lat...)
			r.ok += ok
			for k, n := range codes {
				r.codes[k] += n
				r.requests += n
			}
			for k, n := range errs {
				r.errs[k] += n
				r.requests += n
			}
		}()
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	sort.Slice(r.latencies, func(i, j int) bool { return r.latencies[i] < r.latencies[j] })
	return r, nil
}

func errClass(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	s := err.Error()
	for _, k := range []string{"connection reset", "connection refused", "EOF"} {
		if strings.Contains(s, k) {
			return k
		}
	}
	return "other"
}

func pct(l []time.Duration, p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	i := int(float64(len(l)-1) * p)
	return l[i]
}

func loadavg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(raw))[0]
}

func write(out string, rs []result, concurrency int, duration time.Duration, newConn bool, started time.Time, load0 string) error {
	var sb strings.Builder
	py, _ := exec.Command("python3", "--version").CombinedOutput()
	conn := "a new connection per request (keep-alive off), as many load tools and browsers behave"
	if !newConn {
		conn = "keep-alive connections, one per client"
	}
	fmt.Fprintf(&sb, "# gpu-python template under concurrent load\n\n")
	fmt.Fprintf(&sb, "Written by `make bench-template` (`go run ./test/load/templatebench`). Both variants ran in one run, one after the other.\n\n")
	fmt.Fprintf(&sb, "## Conditions\n\n")
	fmt.Fprintf(&sb, "- Machine: %d CPUs (`runtime.NumCPU`), shared with other work; 1-minute load average %s before the run, %s after.\n", runtime.NumCPU(), load0, loadavg())
	fmt.Fprintf(&sb, "- Go %s, %s; run at %s, took %s.\n", runtime.Version(), strings.TrimSpace(string(py)), started.UTC().Format(time.RFC3339), time.Since(started).Round(time.Second))
	fmt.Fprintf(&sb, "- Real parts: the echo example function (`functions/echo` in `template/gpu-python`, one replica, a python3 process run by the local backend) behind the provider's proxy (`provider/handlers`) on a real HTTP server on 127.0.0.1; %d concurrent clients for %s each, %s, POST of a 5-byte body.\n", concurrency, duration, conn)
	fmt.Fprintf(&sb, "- The only difference between the variants is the template's listen backlog (`FAAS_GPU_LISTEN_BACKLOG`).\n\n")
	fmt.Fprintf(&sb, "## Results\n\n| variant | requests | 2xx | not 2xx (status: count) | client errors | req/s | p50 | p99 | max |\n|---|---:|---:|---|---|---:|---:|---:|---:|\n")
	for _, r := range rs {
		var bad []string
		for code, n := range r.codes {
			if code >= 300 {
				bad = append(bad, fmt.Sprintf("%d: %d", code, n))
			}
		}
		var errs []string
		for k, n := range r.errs {
			errs = append(errs, fmt.Sprintf("%s: %d", k, n))
		}
		sort.Strings(bad)
		sort.Strings(errs)
		fmt.Fprintf(&sb, "| %s | %d | %d | %s | %s | %.0f | %s | %s | %s |\n", r.variant.name, r.requests, r.ok,
			orNone(bad), orNone(errs), float64(r.requests)/r.elapsed.Seconds(), pct(r.latencies, 0.5).Round(time.Millisecond),
			pct(r.latencies, 0.99).Round(time.Millisecond), pct(r.latencies, 1).Round(time.Millisecond))
	}
	fmt.Fprintf(&sb, "\nA dropped connection shows as 502 (`Can't reach service`, the proxy's dial to the replica failed) or as a latency of a SYN retransmit (1 s, 3 s, 7 s) at the top of the distribution.\n")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(out, []byte(sb.String()), 0o644)
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
