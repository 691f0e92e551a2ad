package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/server"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/queueworker/frontdoor"
	"github.com/faas-gpu/faas-gpu/queueworker/functions"
	"github.com/faas-gpu/faas-gpu/queueworker/worker"
)

// Model is one function of the overload workload.
type Model struct {
	Name       string
	Exec       time.Duration // time the function holds a GPU per request
	SLO        time.Duration
	Percentile float64
}

// LoadModels reads models-torpor-v100.csv (columns model, native_ms, slo_ms, slo_percentile among others).
func LoadModels(path string) ([]Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bench: models: %w", err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("bench: models %s: %w", path, err)
	}
	if len(rows) < 2 {
		return nil, fmt.Errorf("bench: models %s: no rows", path)
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	for _, c := range []string{"model", "native_ms", "slo_ms", "slo_percentile"} {
		if _, ok := col[c]; !ok {
			return nil, fmt.Errorf("bench: models %s: no column %q", path, c)
		}
	}
	var out []Model
	for i, r := range rows[1:] {
		exec, err1 := strconv.ParseFloat(r[col["native_ms"]], 64)
		slo, err2 := strconv.ParseFloat(r[col["slo_ms"]], 64)
		p, err3 := strconv.ParseFloat(r[col["slo_percentile"]], 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("bench: models %s: row %d: bad number", path, i+2)
		}
		out = append(out, Model{Name: strings.ReplaceAll(r[col["model"]], "_", "-"), Exec: time.Duration(exec * float64(time.Millisecond)),
			SLO: time.Duration(slo * float64(time.Millisecond)), Percentile: p})
	}
	return out, nil
}

// Strategy is one way of dispatching in the overload scenario.
type Strategy struct {
	Name        string
	Order       worker.Ordering
	MaxInflight int // 0: sized to the pool
}

// Strategies compared in the overload scenario.
func Strategies() []Strategy {
	return []Strategy{
		{Name: "SLO-aware", Order: worker.OrderSLOAware},
		{Name: "FIFO", Order: worker.OrderFIFO},
		{Name: "max_inflight=1 (CE worker)", Order: worker.OrderFIFO, MaxInflight: 1},
	}
}

// Arrival is one request of the overload workload.
type Arrival struct {
	At    time.Duration // since the start of the burst
	Model int
}

// Arrivals draws a Poisson burst at rate factor x the pool's capacity (gpus / mean execution time) for burst,
// with models chosen uniformly, from seed.
func Arrivals(models []Model, gpus int, factor float64, burst time.Duration, seed uint64) ([]Arrival, float64) {
	var mean time.Duration
	for _, m := range models {
		mean += m.Exec
	}
	mean /= time.Duration(len(models))
	rate := factor * float64(gpus) / mean.Seconds()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var out []Arrival
	at := 0.0
	for {
		at += rng.ExpFloat64() / rate
		if at >= burst.Seconds() {
			return out, rate
		}
		out = append(out, Arrival{At: time.Duration(at * float64(time.Second)), Model: rng.IntN(len(models))})
	}
}

// ClassResult is SLO attainment of the requests of one deadline.
type ClassResult struct {
	SLO          time.Duration
	Requests     int
	OnTime       int
	P50, P98     time.Duration
	FunctionsMet int // functions of this class whose on-time share reached their percentile
	Functions    int
}

// OverloadResult is one strategy's outcome.
type OverloadResult struct {
	Strategy   Strategy
	Requests   int
	OnTime     int
	Classes    []ClassResult
	Duplicates int
	Makespan   time.Duration // first arrival to last callback
	// OrderingPerMessage is the time in the ordering policy (push + pop) per request, with the window holding
	// the burst's backlog.
	OrderingPerMessage time.Duration
}

// Overload replays arrivals against a pool of gpus GPUs (a real gpuserver on the node preset gives the worker its
// capacity; the function server runs at most that many requests at once, each holding a GPU slot for its model's
// execution time) with one strategy.
func Overload(ctx context.Context, s Strategy, node topology.Node, models []Model, arrivals []Arrival) (OverloadResult, error) {
	res := OverloadResult{Strategy: s, Requests: len(arrivals)}
	dir, err := os.MkdirTemp("", "queuebench-gpu-")
	if err != nil {
		return res, fmt.Errorf("bench: %w", err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "gpuserver.sock")
	gs, err := server.Start(ctx, server.Config{Socket: sock, Node: node})
	if err != nil {
		return res, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = gs.Shutdown(sctx)
	}()

	byName := map[string]Model{}
	var list []types.FunctionStatus
	for _, m := range models {
		byName[m.Name] = m
		ann := map[string]string{
			contract.AnnotationMemory:     "1Gi",
			contract.AnnotationSLO:        m.SLO.String(),
			contract.AnnotationPercentile: strconv.FormatFloat(m.Percentile, 'f', -1, 64),
		}
		list = append(list, types.FunctionStatus{Name: m.Name, Annotations: &ann})
	}
	gpus := make(chan struct{}, len(node.GPUs))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /system/functions", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(list)
	})
	mux.HandleFunc("/function/{name}", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		m, ok := byName[r.PathValue("name")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		select {
		case gpus <- struct{}{}:
		case <-r.Context().Done():
			return
		}
		time.Sleep(m.Exec)
		<-gpus
	})
	e, err := newEnv(ctx, mux, frontdoor.Config{})
	if err != nil {
		return res, err
	}
	defer e.close()
	fns := functions.NewGateway(functions.GatewayConfig{URL: e.gateway.URL})
	w, stop, err := e.startWorker(worker.Config{Order: s.Order, MaxInflight: s.MaxInflight, Functions: fns,
		Capacity: client.New(sock, client.WithToken(gs.AdminToken())), Client: e.client})
	if err != nil {
		return res, err
	}
	defer stop()

	// Publish on schedule through the front door; 64 senders so that a slow request does not delay the next.
	type job struct {
		id    string
		model string
	}
	jobs := make(chan job, len(arrivals))
	var senders sync.WaitGroup
	var sendErr error
	var errOnce sync.Once
	for range 64 {
		senders.Go(func() {
			for j := range jobs {
				if err := e.post(ctx, j.model, j.id); err != nil {
					errOnce.Do(func() { sendErr = err })
				}
			}
		})
	}
	t0 := time.Now()
	for i, a := range arrivals {
		if d := time.Until(t0.Add(a.At)); d > 0 {
			time.Sleep(d)
		}
		jobs <- job{id: "o-" + strconv.Itoa(i), model: models[a.Model].Name}
	}
	close(jobs)
	senders.Wait()
	if sendErr != nil {
		return res, fmt.Errorf("bench: publishing: %w", sendErr)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	if err := e.cb.wait(wctx, len(arrivals)); err != nil {
		return res, err
	}
	res.Makespan = time.Since(t0)
	res.Duplicates = e.cb.duplicates()
	res.OrderingPerMessage = w.Stats().OrderingTime / time.Duration(max(1, len(arrivals)))

	got := e.cb.snapshot()
	type fnCount struct{ n, on int }
	perFn := map[string]*fnCount{}
	classes := map[time.Duration]*ClassResult{}
	lats := map[time.Duration][]time.Duration{}
	for _, r := range got {
		m := byName[r.function]
		lat := r.arrived.Sub(r.start)
		c := classes[m.SLO]
		if c == nil {
			c = &ClassResult{SLO: m.SLO}
			classes[m.SLO] = c
		}
		c.Requests++
		lats[m.SLO] = append(lats[m.SLO], lat)
		fc := perFn[m.Name]
		if fc == nil {
			fc = &fnCount{}
			perFn[m.Name] = fc
		}
		fc.n++
		if r.status == http.StatusOK && lat <= m.SLO {
			c.OnTime++
			res.OnTime++
			fc.on++
		}
	}
	for name, fc := range perFn {
		m := byName[name]
		c := classes[m.SLO]
		c.Functions++
		if float64(fc.on) >= m.Percentile/100*float64(fc.n) {
			c.FunctionsMet++
		}
	}
	for slo, c := range classes {
		l := lats[slo]
		sortDurations(l)
		c.P50, c.P98 = percentile(l, 50), percentile(l, 98)
		res.Classes = append(res.Classes, *c)
	}
	sortClasses(res.Classes)
	return res, nil
}
