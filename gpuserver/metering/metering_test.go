package metering

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func open(t *testing.T, cfg Config) *Meter {
	t.Helper()
	cfg.SampleInterval, cfg.FlushInterval = time.Hour, time.Hour // the test drives sampling
	m, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func usage(r Report, name string) Counters {
	for _, u := range r.Functions {
		if u.Name == name {
			return u.Counters
		}
	}
	return Counters{}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

// TestBindingsAreMetered: a request's binding counts its GPU seconds and its quota times them; two bound at once
// count twice; time in flight shows as it passes and is not counted twice at the release.
func TestBindingsAreMetered(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 2, 10, 30, 0, 0, time.UTC)}
	m := open(t, Config{Now: c.now})
	const gib = 1 << 30
	m.Begin("b1", "resnet", 3*gib)
	m.Begin("b2", "resnet", 3*gib)
	m.Begin("b3", "bert.dev", 1*gib)
	c.add(2 * time.Second)
	m.End("b2")
	c.add(3 * time.Second)
	if u := usage(m.Report(time.Time{}), "resnet"); !near(u.GPUSeconds, 2+5) || u.Requests != 1 {
		t.Fatalf("resnet in flight: %+v, want 7 GPU seconds (5 in flight) and 1 request", u)
	}
	c.add(5 * time.Second)
	m.End("b1")
	m.End("b3")
	m.End("b3") // a second release is ignored
	r := m.Report(time.Time{})
	if u := usage(r, "resnet"); !near(u.GPUSeconds, 12) || !near(u.GPUMemoryByteSeconds, 12*3*gib) || u.Requests != 2 {
		t.Fatalf("resnet: %+v, want 12 GPU seconds, 36 GiB-seconds, 2 requests", u)
	}
	var bert Usage
	for _, u := range r.Functions {
		if u.Name == "bert.dev" {
			bert = u
		}
	}
	if bert.Function != "bert" || bert.Namespace != "dev" || !near(bert.GPUSeconds, 10) || bert.Requests != 1 {
		t.Fatalf("bert.dev: %+v", bert)
	}
	if f, ns := Split("resnet"); f != "resnet" || ns != DefaultNamespace {
		t.Fatalf("Split(resnet) = %s %s", f, ns)
	}
}

// TestHostImagesAreMetered: the host memory of a function's image counts for the time it is held, sampled.
func TestHostImagesAreMetered(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)}
	images := map[string]uint64{"resnet": 1e9}
	var mu sync.Mutex
	m := open(t, Config{Now: c.now, HostImages: func() (map[string]uint64, error) {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]uint64{}
		for k, v := range images {
			out[k] = v
		}
		return out, nil
	}})
	c.add(10 * time.Second)
	mu.Lock()
	images = map[string]uint64{} // deleted
	mu.Unlock()
	m.sampleImages()
	c.add(10 * time.Second)
	if u := usage(m.Report(time.Time{}), "resnet"); !near(u.HostMemoryByteSeconds, 10e9) || u.GPUSeconds != 0 {
		t.Fatalf("resnet: %+v, want 1e10 host byte-seconds", u)
	}
}

// TestBillSurvivesARestartAndAnswersSince: the counters are in the state file after Close, a new meter goes on from
// them, and a bill since a time sums the hours from that hour on.
func TestBillSurvivesARestartAndAnswersSince(t *testing.T) {
	file := filepath.Join(t.TempDir(), "metering.json")
	c := &clock{t: time.Date(2026, 1, 2, 10, 30, 0, 0, time.UTC)}
	m1, err := Open(Config{File: file, Now: c.now, SampleInterval: time.Hour, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	m1.Begin("a", "resnet", 1<<30)
	c.add(time.Second)
	m1.End("a")
	if err := m1.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v", st, err)
	}

	c.add(time.Hour + 40*time.Minute) // 12:10
	m2 := open(t, Config{File: file, Now: c.now})
	m2.Begin("b", "resnet", 1<<30)
	c.add(2 * time.Second)
	m2.End("b")
	all := m2.Report(time.Time{})
	if u := usage(all, "resnet"); !near(u.GPUSeconds, 3) || u.Requests != 2 {
		t.Fatalf("after a restart: %+v, want 3 GPU seconds and 2 requests", u)
	}
	if !all.Since.Equal(time.Date(2026, 1, 2, 10, 30, 0, 0, time.UTC)) {
		t.Fatalf("the bill began %v, want the first meter's start", all.Since)
	}
	since := m2.Report(time.Date(2026, 1, 2, 12, 5, 0, 0, time.UTC))
	if u := usage(since, "resnet"); !near(u.GPUSeconds, 2) || u.Requests != 1 ||
		!since.Since.Equal(time.Date(2026, 1, 2, 12, 0, 0, 0, time.UTC)) {
		t.Fatalf("since 12:05: %+v from %v, want 2 GPU seconds from 12:00", u, since.Since)
	}
	if u := usage(m2.Report(time.Date(2026, 1, 2, 11, 0, 0, 0, time.UTC)), "resnet"); !near(u.GPUSeconds, 2) {
		t.Fatalf("since 11:00: %+v, want 2 GPU seconds", u)
	}
}

// TestCorruptStateIsMovedAside: a state file that cannot be read back does not stop the gpuserver: it is moved
// aside and the bill starts afresh.
func TestCorruptStateIsMovedAside(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "metering.json")
	if err := os.WriteFile(file, []byte(`{"version":1,"totals":`), 0o600); err != nil {
		t.Fatal(err)
	}
	m := open(t, Config{File: file})
	if r := m.Report(time.Time{}); len(r.Functions) != 0 {
		t.Fatalf("%+v", r)
	}
	matches, _ := filepath.Glob(file + ".corrupt-*")
	if len(matches) != 1 {
		t.Fatalf("moved aside: %v", matches)
	}
}

// TestCollector: /metrics exports the four counters per function with its namespace.
func TestCollector(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 2, 10, 0, 0, 0, time.UTC)}
	m := open(t, Config{Now: c.now})
	m.Begin("a", "bert.dev", 2<<30)
	c.add(4 * time.Second)
	m.End("a")
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, s := range mf.Metric {
			labels := ""
			for _, l := range s.Label {
				labels += l.GetName() + "=" + l.GetValue() + ","
			}
			got[mf.GetName()+"{"+strings.TrimSuffix(labels, ",")+"}"] = s.Counter.GetValue()
		}
	}
	for name, want := range map[string]float64{
		"faas_gpu_usage_gpu_seconds_total{function=bert,namespace=dev}":              4,
		"faas_gpu_usage_gpu_memory_byte_seconds_total{function=bert,namespace=dev}":  8 << 30,
		"faas_gpu_usage_host_memory_byte_seconds_total{function=bert,namespace=dev}": 0,
		"faas_gpu_usage_requests_total{function=bert,namespace=dev}":                 1,
	} {
		if v, ok := got[name]; !ok || !near(v, want) {
			t.Errorf("%s = %v (%v), want %v; all: %v", name, v, ok, want, got)
		}
	}
}
