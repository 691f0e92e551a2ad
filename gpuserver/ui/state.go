package ui

import (
	"context"
	"sort"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/metering"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// State is what the page shows: GET /ui/state.
type State struct {
	Node   string    `json:"node"`
	Policy string    `json:"policy"`
	Time   time.Time `json:"time"`
	// SimKernels is "dry" when the simulated GPUs run kernels dry (results meaningless), as in pool.Status.
	SimKernels string           `json:"sim_kernels,omitempty"`
	Queued     int              `json:"queued"`
	Swaps      map[string]int64 `json:"swaps"`
	GPUs       []GPU            `json:"gpus"`
	Functions  []Function       `json:"functions"`
	Events     []Event          `json:"events"`
	// Queues are the asynchronous queues (nil when the page has none to show); QueuesError says why they are
	// missing.
	Queues      []QueueRow `json:"queues,omitempty"`
	DeadLetters uint64     `json:"dead_letters"`
	QueuesError string     `json:"queues_error,omitempty"`
	// BillSince is when the bill began (functions' Usage); zero without one.
	BillSince time.Time `json:"bill_since,omitzero"`
}

// GPU is one GPU of the pool.
type GPU struct {
	Index       int    `json:"index"`
	Name        string `json:"name"`
	MemoryBytes uint64 `json:"memory_bytes"`
	UsedBytes   uint64 `json:"used_bytes"`
	Busy        bool   `json:"busy"`
	Healthy     bool   `json:"healthy"`
	// Resident are the functions whose model is on the GPU; Running those of them with a request running.
	Resident []string `json:"resident"`
	Running  []string `json:"running"`
	// Shares are the bindings holding compute shares of the GPU now, with their request and limit (co-runners);
	// empty while it is idle or bound exclusively.
	Shares []pool.CoRunner `json:"shares,omitempty"`
}

// Function is one registered function.
type Function struct {
	Name        string  `json:"name"`
	Function    string  `json:"function"`
	Namespace   string  `json:"namespace"`
	MemoryBytes uint64  `json:"memory_bytes"`
	SLOMillis   float64 `json:"slo_ms"`
	Percentile  float64 `json:"percentile"`
	Queued      int     `json:"queued"`
	Running     int     `json:"running"`
	Served      int64   `json:"served"`
	OnTime      int64   `json:"on_time"`
	// Compliance is OnTime/Served in percent; -1 before the first request or without an SLO.
	Compliance float64 `json:"compliance"`
	// Refused counts acquires refused (timeout, too large, overloaded or failed), by result in RefusedBy.
	Refused   int64            `json:"refused"`
	RefusedBy map[string]int64 `json:"refused_by,omitempty"`
	Resident  []int            `json:"resident_gpus"`
	// Usage is the function's bill since BillSince.
	Usage *metering.Counters `json:"usage,omitempty"`
}

// State makes the page's snapshot (reused for stateTTL, so that several open pages cost one).
func (u *UI) State(ctx context.Context) State {
	u.mu.Lock()
	if c := u.cached; c != nil && time.Since(c.Time) < stateTTL {
		s := *c
		u.mu.Unlock()
		return s
	}
	u.mu.Unlock()

	st := u.cfg.Pool.Status(ctx)
	s := State{Node: u.cfg.Node, Policy: st.Policy, Time: time.Now(), Queued: st.Queued, Swaps: st.Swaps,
		GPUs: make([]GPU, 0, len(st.GPUs)), Functions: make([]Function, 0, len(st.Functions))}
	if st.SimKernels == "dry" {
		s.SimKernels = st.SimKernels
	}
	if s.Swaps == nil {
		s.Swaps = map[string]int64{}
	}
	running := map[string]bool{}
	for _, f := range st.Functions {
		if f.Running > 0 {
			running[f.Name] = true
		}
	}
	for _, g := range st.GPUs {
		gpu := GPU{Index: g.Index, Name: g.Name, MemoryBytes: g.MemoryBytes, UsedBytes: g.UsedBytes, Busy: g.Busy,
			Healthy: g.Healthy, Resident: append([]string{}, g.Resident...), Running: []string{},
			Shares: append([]pool.CoRunner(nil), g.CoRunners...)}
		sort.Strings(gpu.Resident)
		for _, f := range gpu.Resident {
			if g.Busy && running[f] {
				gpu.Running = append(gpu.Running, f)
			}
		}
		s.GPUs = append(s.GPUs, gpu)
	}
	refused := u.refusals()
	var bill map[string]metering.Counters
	if u.cfg.Usage != nil {
		r := u.cfg.Usage.Report(time.Time{})
		s.BillSince = r.Since
		bill = make(map[string]metering.Counters, len(r.Functions))
		for _, b := range r.Functions {
			bill[b.Name] = b.Counters
		}
	}
	for _, f := range st.Functions {
		s.Functions = append(s.Functions, function(f, refused[f.Name], bill))
	}
	sort.Slice(s.Functions, func(i, j int) bool { return s.Functions[i].Name < s.Functions[j].Name })
	if u.cfg.Queues != nil {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		rows, dead, err := u.cfg.Queues(qctx)
		cancel()
		if err != nil {
			s.QueuesError = err.Error()
		} else {
			s.Queues, s.DeadLetters = rows, dead
			if s.Queues == nil {
				s.Queues = []QueueRow{}
			}
		}
	}
	u.mu.Lock()
	s.Events = append([]Event{}, u.events...)
	u.cached = &s
	u.mu.Unlock()
	return s
}

// function is a pool function as the page shows it.
func function(f pool.FunctionStatus, refused map[string]int64, bill map[string]metering.Counters) Function {
	fn, ns := metering.Split(f.Name)
	out := Function{Name: f.Name, Function: fn, Namespace: ns, MemoryBytes: f.MemoryBytes,
		SLOMillis: float64(f.SLO) / float64(time.Millisecond), Percentile: f.Percentile, Queued: f.Queued,
		Running: f.Running, Served: f.Served, OnTime: f.OnTime, Compliance: -1, RefusedBy: refused,
		Resident: append([]int{}, f.Resident...)}
	if f.SLO > 0 && f.Served > 0 {
		out.Compliance = 100 * float64(f.OnTime) / float64(f.Served)
	}
	for _, n := range refused {
		out.Refused += n
	}
	if bill != nil {
		c := bill[f.Name]
		out.Usage = &c
	}
	return out
}

// refusals reads faas_gpu_acquire_total: per function, the acquires that ended neither bound (ok) nor given up
// by the caller (canceled).
func (u *UI) refusals() map[string]map[string]int64 {
	out := map[string]map[string]int64{}
	if u.cfg.Metrics == nil {
		return out
	}
	mfs, err := u.cfg.Metrics.Gather()
	if err != nil {
		u.log.Warn("ui: reading the metrics failed", "err", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "faas_gpu_acquire_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var fn, result string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "function":
					fn = l.GetValue()
				case "result":
					result = l.GetValue()
				}
			}
			if fn == "" || result == "ok" || result == "canceled" || m.GetCounter().GetValue() == 0 {
				continue
			}
			if out[fn] == nil {
				out[fn] = map[string]int64{}
			}
			out[fn][result] += int64(m.GetCounter().GetValue())
		}
	}
	return out
}
