package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/api"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// poolStateDir serves a real gpuserver API (first-come-first-served pool of one GPU) on <dir>/gpuserver.sock, as
// `faas-gpu up` lays out its state dir.
func poolStateDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pool") // short: Unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	p, err := pool.NewFCFS([]pool.GPU{{Name: "Tesla V100-SXM2-32GB (simulated)", MemoryBytes: 32 << 30}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	h, err := api.New(p, reg, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(dir, "gpuserver.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return dir
}

// TestPoolStateDirAndNoQueues: `faas-gpu pool --state-dir DIR` finds the gpuserver socket and the NATS URL there;
// --nats-url none shows the GPU pool only, without trying NATS.
func TestPoolStateDirAndNoQueues(t *testing.T) {
	dir := poolStateDir(t)
	var out bytes.Buffer
	if err := runPool(context.Background(), []string{"--state-dir", dir}, &out, &out); err != nil {
		t.Fatalf("pool --state-dir without a nats-url file: %v", err)
	}
	if !strings.Contains(out.String(), "GPU") || strings.Contains(out.String(), "QUEUE  ") || strings.Contains(out.String(), "dead letters") {
		t.Errorf("output:\n%s", out.String())
	}
	// A nats-url file in the state dir is used (here it names nothing that listens) unless --nats-url none.
	if err := os.WriteFile(filepath.Join(dir, natsURLFile), []byte("nats://127.0.0.1:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := runPool(context.Background(), []string{"--state-dir", dir}, &out, &out); err == nil ||
		!strings.Contains(err.Error(), "nats://127.0.0.1:1") {
		t.Errorf("pool with the state dir's nats-url: %v, want an error naming that URL", err)
	}
	out.Reset()
	if err := runPool(context.Background(), []string{"--state-dir", dir, "--nats-url", "none"}, &out, &out); err != nil {
		t.Fatalf("pool --nats-url none: %v", err)
	}
	if !strings.Contains(out.String(), "policy:") {
		t.Errorf("output:\n%s", out.String())
	}
}

// TestPrintPoolTwoFiguresAndShedding: the pool's printout carries both figures (functions and requests within
// SLO), the refusals, and the overload control's setting and shedding set, per function and for the node.
func TestPrintPoolTwoFiguresAndShedding(t *testing.T) {
	st := pool.Status{Policy: "faas-gpu", Functions: []pool.FunctionStatus{
		{FunctionSpec: pool.FunctionSpec{Name: "light", MemoryBytes: 1 << 30, SLO: 80 * time.Millisecond}, Served: 100,
			OnTime: 100},
		{FunctionSpec: pool.FunctionSpec{Name: "heavy", MemoryBytes: 1 << 30, SLO: 80 * time.Millisecond}, Served: 50,
			OnTime: 40, Refused: 10, Shed: true},
	}, Overload: &pool.OverloadView{Setting: "auto", Demand: 4.3, Capacity: 4, Shedding: []string{"heavy"}, Refused: 10}}
	var out bytes.Buffer
	printPool(&out, st)
	for _, want := range []string{"functions within SLO: 1/2", "requests within SLO: 140/160", "refused: 10",
		"overload control: auto, demand 4.30 of 4 GPUs, shedding: heavy", "REFUSED", "SHED"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("printout lacks %q:\n%s", want, out.String())
		}
	}
}

// TestPrintPoolFaultBackoff: a function backed off after repeated kernel faults shows its faults and how much longer
// it is backed off; another shows none.
func TestPrintPoolFaultBackoff(t *testing.T) {
	st := pool.Status{Policy: "faas-gpu", Functions: []pool.FunctionStatus{
		{FunctionSpec: pool.FunctionSpec{Name: "faulty", MemoryBytes: 1 << 30}, Faults: 9, BackedOff: 3700 * time.Millisecond},
		{FunctionSpec: pool.FunctionSpec{Name: "fine", MemoryBytes: 1 << 30}, Served: 5},
	}}
	var out bytes.Buffer
	printPool(&out, st)
	var faulty, fine string
	for _, l := range strings.Split(out.String(), "\n") {
		switch f := strings.Fields(l); {
		case len(f) > 0 && f[0] == "faulty":
			faulty = l
		case len(f) > 0 && f[0] == "fine":
			fine = l
		}
	}
	ff, gf := strings.Fields(faulty), strings.Fields(fine)
	if !strings.Contains(out.String(), "BACKED OFF") || len(ff) < 2 || ff[len(ff)-2] != "9" || ff[len(ff)-1] != "4s" ||
		len(gf) < 2 || gf[len(gf)-2] != "0" || gf[len(gf)-1] != "-" {
		t.Fatalf("printout:\n%s", out.String())
	}
}
