// Command remoting (test/bench/remoting) measures the remoting transport: it starts a remoting server whose handler does no device
// work (it counts the calls it decodes, so every record is really transported and decoded), runs the shim's
// bench_remoting program once per mode, and writes the figures and conditions to a Markdown file.
//
// Modes: async (the default shim: every async record published at once, the doorbell rung only while the server
// sleeps), all synchronous (every call waits for its result: a GVirtuS-style baseline).
//
//	go run ./test/bench/remoting -out docs/bench/remoting.md
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/remoting"
)

type counter struct {
	remoting.UnimplementedHandler
	launches, syncs *atomic.Int64
}

func (c counter) CuCtxSynchronize(context.Context) remoting.Result {
	c.syncs.Add(1)
	return remoting.ResultSuccess
}

func (c counter) CuLaunchKernel(_ context.Context, f uint64, _, _, _, _, _, _, _ uint32, _ uint64, args []byte,
	_ uint64) remoting.Result {
	if f == 0 || len(args) != 32 {
		return remoting.ResultInvalidValue
	}
	c.launches.Add(1)
	return remoting.ResultSuccess
}

type reg struct{}

func (reg) Function(name string) (pool.FunctionSpec, string, error) {
	return pool.FunctionSpec{Name: name, MemoryBytes: 1 << 30}, "bench", nil
}

type mode struct {
	name, env, what string
	async           int // async calls; the all-synchronous mode makes fewer (each is a round trip)
}

func main() {
	out := flag.String("out", "docs/bench/remoting.md", "Markdown file to write")
	bin := flag.String("bench", "shim/build/bench_remoting", "the shim's bench program")
	nsync := flag.Int("sync-calls", 200000, "synchronous round trips per mode")
	nasync := flag.Int("async-calls", 2000000, "async calls per mode")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *out, *bin, *nsync, *nasync); err != nil {
		fmt.Fprintln(os.Stderr, "remoting-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out, bin string, nsync, nasync int) error {
	var launches, syncs atomic.Int64
	srv, err := remoting.NewServer(remoting.Config{
		Functions: reg{},
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		NewHandler: func(context.Context, remoting.SessionInfo) (remoting.Handler, error) {
			return counter{launches: &launches, syncs: &syncs}, nil
		},
	})
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "remoting-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "r.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(sctx, l) }()
	defer func() { cancel(); <-done }()

	modes := []mode{
		{"async", "", "every async record published at once; the doorbell rung only while the server sleeps", 0},
		{"all synchronous", "FAAS_GPU_REMOTING_SYNC=1", "every call waits for its result (GVirtuS-style); async figure from nsync calls", nsync},
	}
	results := make([]map[string]string, len(modes))
	for i, m := range modes {
		launches.Store(0)
		n := nasync
		if m.async > 0 {
			n = m.async
		}
		cmd := exec.CommandContext(ctx, bin, strconv.Itoa(nsync), strconv.Itoa(n))
		cmd.Env = append(os.Environ(), "FAAS_GPU_REMOTING_SOCKET="+sock, "FAAS_GPU_FUNCTION=bench", "FAAS_GPU_TOKEN=bench")
		if m.env != "" {
			cmd.Env = append(cmd.Env, m.env)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		o, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("%s: %w: %s", m.name, err, stderr.String())
		}
		results[i] = map[string]string{}
		sc := bufio.NewScanner(bytes.NewReader(o))
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), " ")
			results[i][k] = v
		}
		if got := launches.Load(); got != int64(n) {
			return fmt.Errorf("%s: the server decoded %d launches, the shim made %d", m.name, got, n)
		}
		fmt.Fprintf(os.Stderr, "%s: %v\n", m.name, results[i])
	}
	return os.WriteFile(out, []byte(report(modes, results, nsync, nasync)), 0o644)
}

func us(ns string) string {
	v, _ := strconv.ParseFloat(ns, 64)
	return fmt.Sprintf("%.2f", v/1000)
}

func mcalls(s string) string {
	v, _ := strconv.ParseFloat(s, 64)
	return fmt.Sprintf("%.2f M", v/1e6)
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "model name") {
			_, v, _ := strings.Cut(line, ":")
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func report(modes []mode, res []map[string]string, nsync, nasync int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Remoting transport benchmark\n\n")
	fmt.Fprintf(&b, "Written by `make bench-remoting` (test/bench/remoting) on %s.\n\n",
		time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "The C shim (shim/build/libcuda.so.1) talks to the Go remoting server over the Unix socket and the\n"+
		"shared-memory ring. The server decodes every record with the generated decoder and dispatches it to a handler\n"+
		"that does no device work but counts the launches it decoded (checked against the calls made), so the figures\n"+
		"are the transport's: encode, ring, doorbell, decode, dispatch, response. All modes ran in this one run.\n\n")
	fmt.Fprintf(&b, "| mode | sync round trip p50 (us) | p99 (us) | mean (us) | async calls/s per connection |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|\n")
	for i, m := range modes {
		r := res[i]
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", m.name, us(r["sync_p50_ns"]), us(r["sync_p99_ns"]),
			us(r["sync_mean_ns"]), mcalls(r["async_calls_per_s"]))
	}
	fmt.Fprintf(&b, "\nTargets: sync round trip <= 5 us p50; >= 2 M async calls/s per connection.\n\n")
	fmt.Fprintf(&b, "## Modes\n\n")
	for _, m := range modes {
		env := m.env
		if env == "" {
			env = "(defaults)"
		}
		fmt.Fprintf(&b, "- **%s** `%s`: %s.\n", m.name, env, m.what)
	}
	fmt.Fprintf(&b, "\n## Conditions\n\n")
	fmt.Fprintf(&b, "- machine: %d CPUs (`nproc`), %s; shared with other work while measured\n", runtime.NumCPU(), cpuModel())
	fmt.Fprintf(&b, "- %s, %s/%s; shim built with gcc -O2\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&b, "- sync: %d cuCtxSynchronize round trips after 1000 warm-up calls, each timed with CLOCK_MONOTONIC\n", nsync)
	fmt.Fprintf(&b, "- async: %d cuLaunchKernel calls (the all-synchronous mode: as many as sync round trips) (32-byte argument buffer via CU_LAUNCH_PARAM_BUFFER_POINTER, a\n"+
		"  136-byte record), then one cuCtxSynchronize; calls/s includes draining the ring\n", nasync)
	fmt.Fprintf(&b, "- ring 8 MiB, response area 4 MiB, both sides spin 50 us before sleeping on the socket\n")
	fmt.Fprintf(&b, "- no seed: the inputs are fixed\n")
	return b.String()
}
