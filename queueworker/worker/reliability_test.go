package worker_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/queueworker/frontdoor"
	"github.com/faas-gpu/faas-gpu/queueworker/internal/jstest"
	"github.com/faas-gpu/faas-gpu/queueworker/natsserver"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// Environment of the worker child process (this test binary re-executed).
const (
	envChild     = "FAAS_GPU_QW_TEST_CHILD"
	envChildNATS = "FAAS_GPU_QW_TEST_NATS"
	envChildGW   = "FAAS_GPU_QW_TEST_GATEWAY"
	// childAckWait is long enough that a worker slowed by a loaded machine keeps its leases (in-progress acks every
	// third of it), short enough that a killed worker's messages come back well within the test's deadlines.
	childAckWait  = 10 * time.Second
	childInflight = 32
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) == "1" {
		os.Exit(childWorker())
	}
	testkit.VerifyNoLeaks(m) // pullers, dispatchers and invocations end with their worker
}

// childWorker runs a worker until SIGTERM (or until it is killed).
func childWorker() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	w, err := worker.New(worker.Config{
		NATSURL:     os.Getenv(envChildNATS),
		GatewayURL:  os.Getenv(envChildGW),
		MaxInflight: childInflight,
		AckWait:     childAckWait,
		Order:       worker.OrderSLOAware,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child worker:", err)
		return 1
	}
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child worker:", err)
		return 1
	}
	return 0
}

// childProc is a worker running as a child process.
type childProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startChild(t *testing.T, natsURL, gatewayURL string) *childProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=1", envChildNATS+"="+jstest.AuthURL(natsURL), envChildGW+"="+gatewayURL)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &childProc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() { c.kill() })
	return c
}

func (c *childProc) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// 10,000 asynchronous calls through the front door while the worker process is killed with SIGKILL and restarted
// twice and the NATS server is restarted once (same store, same port): every call's callback arrives; duplicates
// are counted and bounded by what at-least-once delivery allows (messages held by a killed worker or acked
// across the NATS restart).
func TestReliabilityKillsAndRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("reliability test skipped in -short mode")
	}
	const total = 10000
	ctx := context.Background()
	store := t.TempDir()
	ns, err := natsserver.Start(ctx, jstest.Config(store))
	if err != nil {
		t.Fatal(err)
	}
	var nsMu sync.Mutex
	t.Cleanup(func() { nsMu.Lock(); ns.Shutdown(); nsMu.Unlock() })
	natsURL, port := ns.ClientURL(), ns.Port()
	_, js := jstest.Connect(t, natsURL)
	if err := frontdoor.EnsureStreams(ctx, js); err != nil {
		t.Fatal(err)
	}

	// No-op functions behind a gateway; the callback receiver counts callbacks per call.
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, r.Header.Get("X-Call-Id"))
	}))
	defer gw.Close()
	var cbMu sync.Mutex
	seen := make(map[string]int, total)
	var distinct, bad atomic.Int64
	cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		id := r.Header.Get("X-Call-Id")
		if string(b) != id || r.Header.Get("X-Function-Status") != "200" {
			bad.Add(1)
		}
		cbMu.Lock()
		seen[id]++
		if seen[id] == 1 {
			distinct.Add(1)
		}
		cbMu.Unlock()
	}))
	defer cb.Close()
	front := httptest.NewServer(frontdoor.New(frontdoor.Config{JetStream: js, PublishTimeout: 2 * time.Second}))
	defer front.Close()

	// Publishers: 8 clients; a call refused while NATS is down is sent again with the same X-Call-Id (the front
	// door's JetStream message ID, so a publish that was stored but not confirmed is not queued twice).
	var published atomic.Int64
	pubCtx, stopPub := context.WithCancel(ctx)
	defer stopPub()
	var pubs sync.WaitGroup
	const publishers = 8
	for p := range publishers {
		pubs.Go(func() {
			client := &http.Client{Timeout: 10 * time.Second}
			for i := p; i < total; i += publishers {
				id := "call-" + strconv.Itoa(i)
				for pubCtx.Err() == nil {
					req, _ := http.NewRequest(http.MethodPost, front.URL+"/async-function/noop", strings.NewReader("x"))
					req.Header.Set("X-Call-Id", id)
					req.Header.Set("X-Callback-Url", cb.URL)
					res, err := client.Do(req)
					if err == nil {
						res.Body.Close()
						if res.StatusCode == http.StatusAccepted {
							published.Add(1)
							break
						}
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}

	child := startChild(t, natsURL, gw.URL)
	waitFor := func(n int64, what string) {
		t.Helper()
		testkit.Eventually(t, 90*time.Second, fmt.Sprintf("%s: %d of %d callbacks (published %d)", what, distinct.Load(), n, published.Load()), func() bool { return distinct.Load() >= n })
	}
	waitFor(1500, "before the first kill")
	child.kill()
	child = startChild(t, natsURL, gw.URL)
	waitFor(4000, "before the second kill")
	child.kill()
	child = startChild(t, natsURL, gw.URL)
	waitFor(6000, "before the NATS restart")
	nsMu.Lock()
	ns.Shutdown()
	restart := jstest.Config(store)
	restart.Port = port
	ns, err = natsserver.Start(ctx, restart)
	nsMu.Unlock()
	if err != nil {
		t.Fatalf("restarting NATS on port %d: %v", port, err)
	}
	waitFor(total, "all callbacks")
	pubs.Wait()

	// Let late redeliveries (after ack wait) land, then check the stream is empty: nothing left unacked.
	testkit.Eventually(t, 30*time.Second, "queue stream empty", func() bool {
		st, err := js.Stream(ctx, queue.Stream(queue.DefaultQueue))
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})

	cbMu.Lock()
	defer cbMu.Unlock()
	dups := 0
	for i := range total {
		n := seen["call-"+strconv.Itoa(i)]
		if n == 0 {
			t.Errorf("call-%d: no callback", i)
		}
		dups += max(0, n-1)
	}
	if len(seen) != total {
		t.Errorf("callbacks for %d distinct call IDs, want %d", len(seen), total)
	}
	if bad.Load() > 0 {
		t.Errorf("%d callbacks with a wrong body or status", bad.Load())
	}
	// At-least-once bound: each SIGKILL can repeat at most what the killed worker held (window + running), and
	// the NATS restart at most what was held then too.
	capacity := childInflight + max(1024, 4*childInflight)
	if limit := 3 * capacity; dups > limit {
		t.Errorf("%d duplicate callbacks, more than at-least-once allows (%d)", dups, limit)
	}
	t.Logf("10,000 calls: %d callbacks, %d duplicates (bound %d), published %d", total+dups, dups, 3*capacity, published.Load())
	child.cmd.Process.Signal(syscall.SIGTERM)
	<-child.done
}
