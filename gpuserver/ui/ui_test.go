package ui

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/metering"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// fakePool is a pool whose status the test sets.
type fakePool struct {
	mu sync.Mutex
	st pool.Status
}

func (p *fakePool) Status(context.Context) pool.Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st
}

func (p *fakePool) set(st pool.Status) {
	p.mu.Lock()
	p.st = st
	p.mu.Unlock()
}

type fakeUsage struct{}

func (fakeUsage) Report(time.Time) metering.Report {
	return metering.Report{Since: time.Unix(100, 0), Functions: []metering.Usage{{Name: "resnet", Function: "resnet",
		Namespace: metering.DefaultNamespace, Counters: metering.Counters{Requests: 3, GPUSeconds: 1.5}}}}
}

func status(resident0, resident1 []string, healthy1 bool, swaps map[string]int64) pool.Status {
	return pool.Status{Policy: "faas-gpu", Swaps: swaps,
		GPUs: []pool.GPUStatus{
			{Index: 0, Name: "H100", MemoryBytes: 80 << 30, UsedBytes: 3 << 30, Busy: true, Healthy: true, Resident: resident0},
			{Index: 1, Name: "H100", MemoryBytes: 80 << 30, Healthy: healthy1, Resident: resident1}},
		Functions: []pool.FunctionStatus{
			{FunctionSpec: pool.FunctionSpec{Name: "resnet", MemoryBytes: 3 << 30, SLO: 250 * time.Millisecond,
				Percentile: 98}, Running: 1, Served: 10, OnTime: 9, Resident: []int{0}},
			{FunctionSpec: pool.FunctionSpec{Name: "bert.dev", MemoryBytes: 3 << 30, Percentile: 98}, Queued: 2}}}
}

func get(t *testing.T, h http.Handler, method, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Result()
}

// TestStateAndEvents: the state has each GPU with its memory and residents (running ones marked), each function
// with SLO compliance, refusals (from faas_gpu_acquire_total) and bill; swaps, evictions and GPU failures between
// samples become events.
func TestStateAndEvents(t *testing.T) {
	p := &fakePool{}
	p.set(status([]string{"resnet"}, nil, true, map[string]int64{"pcie": 1}))
	reg := prometheus.NewRegistry()
	acq := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faas_gpu_acquire_total"}, []string{"function", "result"})
	reg.MustRegister(acq)
	acq.WithLabelValues("bert.dev", "timeout").Add(2)
	acq.WithLabelValues("bert.dev", "error").Add(1)
	acq.WithLabelValues("bert.dev", "ok").Add(5)
	acq.WithLabelValues("resnet", "canceled").Add(4)
	u, err := New(Config{Pool: p, Usage: fakeUsage{}, Metrics: reg, Node: "n1", Interval: 5 * time.Millisecond,
		Queues: func(context.Context) ([]QueueRow, uint64, error) {
			return []QueueRow{{Queue: "faas-request", Messages: 4}}, 1, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	time.Sleep(20 * time.Millisecond) // a first sample
	// resnet moves from GPU 0 to GPU 1 over PCIe, bert.dev comes in on GPU 0, and GPU 1 fails.
	p.set(status([]string{"bert.dev"}, []string{"resnet"}, false, map[string]int64{"pcie": 3}))
	deadline := time.Now().Add(5 * time.Second)
	var s State
	for {
		time.Sleep(stateTTL + 10*time.Millisecond)
		s = u.State(context.Background())
		if len(s.Events) >= 4 || time.Now().After(deadline) {
			break
		}
	}
	kinds := map[string]string{}
	for _, e := range s.Events {
		kinds[e.Kind+" "+e.Function] += e.Detail + "@" + string(rune('0'+e.GPU))
	}
	for _, want := range []string{"swap-in bert.dev", "swap-in resnet", "evict resnet", "gpu-failed "} {
		if _, ok := kinds[want]; !ok {
			t.Errorf("no %q event: %+v", want, s.Events)
		}
	}
	if kinds["swap-in resnet"] != "pcie +2@1" || kinds["evict resnet"] != "@0" {
		t.Errorf("events %v", kinds)
	}
	if s.Node != "n1" || s.Policy != "faas-gpu" || len(s.GPUs) != 2 || s.GPUs[0].MemoryBytes != 80<<30 ||
		s.GPUs[0].UsedBytes != 3<<30 || s.GPUs[1].Healthy {
		t.Fatalf("gpus: %+v", s.GPUs)
	}
	var resnet, bert Function
	for _, f := range s.Functions {
		switch f.Name {
		case "resnet":
			resnet = f
		case "bert.dev":
			bert = f
		}
	}
	if resnet.Compliance != 90 || resnet.SLOMillis != 250 || resnet.Refused != 0 || resnet.Usage == nil ||
		resnet.Usage.GPUSeconds != 1.5 || resnet.Namespace != metering.DefaultNamespace {
		t.Fatalf("resnet: %+v", resnet)
	}
	if bert.Compliance != -1 || bert.Refused != 3 || bert.RefusedBy["timeout"] != 2 || bert.Namespace != "dev" ||
		bert.Queued != 2 || bert.Usage == nil || bert.Usage.Requests != 0 {
		t.Fatalf("bert.dev: %+v", bert)
	}
	if len(s.Queues) != 1 || s.Queues[0].Messages != 4 || s.DeadLetters != 1 {
		t.Fatalf("queues: %+v %d", s.Queues, s.DeadLetters)
	}

	// Over HTTP: the JSON, and running functions on their GPU.
	resp := get(t, u, http.MethodGet, "/ui/state")
	var got State
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("/ui/state: %v %v", err, resp.Header)
	}
	if len(got.GPUs[0].Running) != 0 || got.GPUs[0].Resident[0] != "bert.dev" {
		t.Fatalf("gpu 0: %+v (bert.dev is resident and does not run)", got.GPUs[0])
	}
}

// TestPageIsSelfContained: the page, its script and style come from the binary with a policy that allows this
// origin only; the page loads nothing from elsewhere; other methods and paths are refused.
func TestPageIsSelfContained(t *testing.T) {
	u, err := New(Config{Pool: &fakePool{}})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	for path, ctype := range map[string]string{"/ui": "text/html", "/ui/": "text/html",
		"/ui/app.js": "javascript", "/ui/style.css": "text/css"} {
		resp := get(t, u, http.MethodGet, path)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Type"), ctype) ||
			!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'; script-src 'self'") ||
			resp.Header.Get("X-Frame-Options") != "DENY" {
			t.Fatalf("%s: %d %v", path, resp.StatusCode, resp.Header)
		}
		text := string(body)
		if strings.Contains(text, "http://") || strings.Contains(text, "https://") || strings.Contains(text, "//cdn") {
			t.Errorf("%s refers to another origin", path)
		}
		if path == "/ui" && (strings.Contains(text, "<script>") || !strings.Contains(text, `src="/ui/app.js"`)) {
			t.Errorf("/ui must load its script from /ui/app.js only")
		}
		if path == "/ui/app.js" && strings.Contains(text, "innerHTML") {
			t.Errorf("app.js writes HTML from data")
		}
	}
	if resp := get(t, u, http.MethodPost, "/ui/state"); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", resp.StatusCode)
	}
	if resp := get(t, u, http.MethodGet, "/ui/../etc/passwd"); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a path outside the page: %d", resp.StatusCode)
	}
}

// TestStateShowsCoRunnersShares: a GPU's shared bindings come with their shares.
func TestStateShowsCoRunnersShares(t *testing.T) {
	st := status([]string{"resnet", "bert.dev"}, nil, true, nil)
	st.GPUs[0].CoRunners = []pool.CoRunner{{Function: "resnet", Request: 0.5, Limit: 0.75}, {Function: "bert.dev", Request: 0.3, Limit: 0.5}}
	p := &fakePool{}
	p.set(st)
	u, err := New(Config{Pool: p, Node: "n1", Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	s := u.State(context.Background())
	if len(s.GPUs) != 2 || len(s.GPUs[0].Shares) != 2 || s.GPUs[0].Shares[1] != (pool.CoRunner{Function: "bert.dev", Request: 0.3, Limit: 0.5}) ||
		len(s.GPUs[1].Shares) != 0 {
		t.Fatalf("gpus: %+v", s.GPUs)
	}
}
