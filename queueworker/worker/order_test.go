package worker_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/server"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/queueworker/frontdoor"
	"github.com/faas-gpu/faas-gpu/queueworker/functions"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// With the window full and one invocation at a time, the SLO-aware order serves the function with the tighter
// deadline first, although its messages were published after the looser function's; FIFO serves publish order.
func TestSLOAwareOrderServesTighterDeadlinesFirst(t *testing.T) {
	for _, tc := range []struct {
		order     worker.Ordering
		wantFirst string
	}{
		{worker.OrderSLOAware, "tight"},
		{worker.OrderFIFO, "loose"},
	} {
		t.Run(string(tc.order), func(t *testing.T) {
			gate, blocked := make(chan struct{}), make(chan struct{}, 1)
			var mu sync.Mutex
			var order []string
			e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
				name := strings.TrimPrefix(r.URL.Path, "/function/")
				if name == "block" {
					blocked <- struct{}{}
					<-gate
					return
				}
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
			})
			fns := functionsMap{
				"block": {Name: "block", Queue: queue.DefaultQueue},
				"loose": {Name: "loose", Queue: queue.DefaultQueue, SLO: time.Hour, Percentile: 98},
				"tight": {Name: "tight", Queue: queue.DefaultQueue, SLO: time.Minute, Percentile: 98},
			}
			w := e.run(worker.Config{Functions: fns, MaxInflight: 1, Lookahead: 64, Order: tc.order})
			t.Cleanup(func() {
				select {
				case <-gate:
				default:
					close(gate)
				}
			})
			// The blocker holds the only slot while the others fill the window.
			ids := []string{e.send("/async-function/block", "", nil)}
			<-blocked
			start := strconv.FormatInt(time.Now().UnixNano(), 10)
			for range 10 {
				ids = append(ids, e.send("/async-function/loose", "", map[string]string{"X-Start-Time": start}))
			}
			for range 10 {
				ids = append(ids, e.send("/async-function/tight", "", map[string]string{"X-Start-Time": start}))
			}
			testkit.Eventually(t, 10*time.Second, fmt.Sprintf("20 messages in the window (have %d)", w.Stats().Window), func() bool { return w.Stats().Window == 20 })
			close(gate)
			for _, id := range ids {
				e.waitCallback(id)
			}
			mu.Lock()
			defer mu.Unlock()
			for i, name := range order {
				want := tc.wantFirst
				if i >= 10 {
					want = map[string]string{"tight": "loose", "loose": "tight"}[tc.wantFirst]
				}
				if name != want {
					t.Fatalf("invocation %d was %s, want %s; order %v", i, name, want, order)
				}
			}
		})
	}
}

// GPU functions are admitted by the gpuserver pool's capacity (a real gpuserver on a simulated 4-GPU node): at
// most one invocation per GPU runs at once, while CPU functions keep flowing past the blocked GPU ones.
func TestPoolCapacityAdmitsGPUFunctions(t *testing.T) {
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "gpuserver.sock")
	srv, err := server.Start(context.Background(), server.Config{Socket: sock, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})

	gate := make(chan struct{})
	var running, peak atomic.Int32
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.HasSuffix(r.URL.Path, "/gpu") {
			n := running.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			<-gate
			running.Add(-1)
		}
	})
	// Registered after newEnv's, so it runs first: a failure below must not leave handlers held at the gate and
	// the env's server waiting for them until the package times out.
	var releaseGate sync.Once
	release := func() { releaseGate.Do(func() { close(gate) }) }
	t.Cleanup(release)
	fns := functionsMap{
		"gpu": {Name: "gpu", Queue: queue.DefaultQueue, GPU: true, SLO: time.Second, Percentile: 98},
		"cpu": {Name: "cpu", Queue: queue.DefaultQueue},
	}
	var gpuIDs, cpuIDs []string
	for range 12 {
		gpuIDs = append(gpuIDs, e.send("/async-function/gpu", "", nil))
	}
	for range 5 {
		cpuIDs = append(cpuIDs, e.send("/async-function/cpu", "", nil))
	}
	// The pool's capacity is read with the administrator's credential (/v1/pool answers 401 without one).
	e.run(worker.Config{Functions: fns, Capacity: client.New(sock, client.WithToken(srv.AdminToken())), MaxInflight: 16})
	for _, id := range cpuIDs {
		e.waitCallback(id) // CPU calls complete while the GPU ones are held back
	}
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("%d GPU invocations running", len(node.GPUs)), func() bool { return running.Load() == int32(len(node.GPUs)) })
	release()
	for _, id := range gpuIDs {
		e.waitCallback(id)
	}
	if p := peak.Load(); p != int32(len(node.GPUs)) {
		t.Fatalf("peak concurrent GPU invocations %d, want the pool's %d GPUs", p, len(node.GPUs))
	}
	if got := metricValue(t, e.reg, "faas_gpu_queue_slo_served_total", map[string]string{"function": "gpu"}); got != 12 {
		t.Fatalf("SLO served for gpu %v, want 12", got)
	}
}

var _ functions.Source = functionsMap{}

// listed is a functions.Source that also lists, so the worker discovers named queues.
type listed struct{ functionsMap }

func (l listed) Functions(context.Context) ([]functions.Function, error) {
	var out []functions.Function
	for _, f := range l.functionsMap {
		out = append(out, f)
	}
	return out, nil
}

// A function annotated with a named queue is published to its own stream, which the worker discovers and
// consumes; the default queue keeps flowing beside it.
func TestNamedQueueIsDiscoveredAndConsumed(t *testing.T) {
	e := newEnv(t, echo)
	fns := listed{functionsMap{
		"batch": {Name: "batch", Queue: "batch-queue"},
		"echo":  {Name: "echo", Queue: queue.DefaultQueue},
	}}
	front := httptest.NewServer(frontdoor.New(frontdoor.Config{JetStream: e.js, Functions: fns}))
	defer front.Close()
	send := func(fn string) string {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/async-function/"+fn, strings.NewReader(fn))
		req.Header.Set("X-Callback-Url", e.cbServer.URL)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusAccepted {
			t.Fatalf("front door: %d", res.StatusCode)
		}
		return res.Header.Get("X-Call-Id")
	}
	var ids []string
	for range 5 {
		ids = append(ids, send("batch"), send("echo"))
	}
	if n := e.streamMsgs("batch-queue"); n != 5 {
		t.Fatalf("stream OF_batch-queue holds %d messages, want 5", n)
	}
	e.run(worker.Config{Functions: fns, DiscoverQueues: 20 * time.Millisecond})
	for _, id := range ids {
		if cb := e.waitCallback(id); cb.header.Get("X-Function-Status") != "200" {
			t.Fatalf("callback %v", cb.header)
		}
	}
	testkit.Eventually(t, 10*time.Second, "named queue drained", func() bool { return e.streamMsgs("batch-queue") == 0 })
}

// A backlog on one named queue does not take every slot: the default queue's calls run while the named queue's
// calls hold all the others.
func TestQueuesDoNotStarveEachOther(t *testing.T) {
	gate := make(chan struct{})
	var slow atomic.Int32
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/batch") {
			slow.Add(1)
			<-gate
		}
	})
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	fns := listed{functionsMap{
		"batch": {Name: "batch", Queue: "batch-queue"},
		"echo":  {Name: "echo", Queue: queue.DefaultQueue},
	}}
	front := httptest.NewServer(frontdoor.New(frontdoor.Config{JetStream: e.js, Functions: fns}))
	defer front.Close()
	send := func(fn string) string {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/async-function/"+fn, nil)
		req.Header.Set("X-Callback-Url", e.cbServer.URL)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.Header.Get("X-Call-Id")
	}
	var batch []string
	for range 10 {
		batch = append(batch, send("batch"))
	}
	e.run(worker.Config{Functions: fns, MaxInflight: 4, DiscoverQueues: 20 * time.Millisecond})
	testkit.Eventually(t, 10*time.Second, "3 batch calls running", func() bool { return slow.Load() == 3 })
	for range 5 {
		e.waitCallback(send("echo")) // served while the batch queue holds 3 of the 4 slots
	}
	if n := slow.Load(); n != 3 {
		t.Fatalf("%d batch calls running, want 3 (one slot kept for the default queue)", n)
	}
	close(gate)
	for _, id := range batch {
		e.waitCallback(id)
	}
}
