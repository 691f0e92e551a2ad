package simulate

import (
	"math"
	"slices"
	"time"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// Bound is an upper bound, computed offline from a run's arrivals, on how many functions any policy could keep
// within their SLO on the node.
type Bound struct {
	// Functions is the bound: the most functions whose least GPU time fits the node's GPU time.
	Functions int `json:"functions"`
	// FunctionsWithTraffic is the number of functions with at least one request (the share's denominator).
	FunctionsWithTraffic int `json:"functions_with_requests"`
	// Share is Functions / FunctionsWithTraffic.
	Share float64 `json:"share"`
	// DemandGPUSeconds is the least GPU time of every function with traffic together; CapacityGPUSeconds the
	// node's GPU time over the run (the window plus the longest SLO, for requests arriving at its end).
	DemandGPUSeconds   float64 `json:"demand_gpu_seconds"`
	CapacityGPUSeconds float64 `json:"capacity_gpu_seconds"`
}

// OfflineBound computes the bound for cfg (its policy's execution times: native or remoted). A function with n
// requests and SLO percentile p meets its SLO only if at least ceil(p*n) of them run on time, each holding a GPU
// for at least its execution time, and its model reaches a GPU at least once (a swap from host alone, unless the
// node starts warm); a function whose execution alone exceeds its deadline can never meet it. Every function
// counts the same, so the most functions whose least GPU time fits the capacity are the cheapest ones: the bound
// sums them in increasing order. It ignores memory, queueing and contention, so no policy can exceed it; it is
// loose where load is bursty (capacity idle in one minute cannot serve the next).
func OfflineBound(cfg Config) (Bound, error) {
	if err := cfg.check(); err != nil {
		return Bound{}, err
	}
	ref, err := topology.Preset("v100x4")
	if err != nil {
		return Bound{}, err
	}
	arrivals := cfg.Arrivals
	span := time.Duration(cfg.Minutes) * time.Minute
	if arrivals == nil {
		arrivals = cfg.arrivals()
	} else if len(arrivals) > 0 {
		span = arrivals[len(arrivals)-1].At
	}
	counts := make([]int, cfg.Functions)
	for _, a := range arrivals {
		counts[a.Function]++
	}
	var b Bound
	var maxSLO time.Duration
	var least []float64
	for i, n := range counts {
		if n == 0 {
			continue
		}
		b.FunctionsWithTraffic++
		fm := cfg.fnModel(i, &ref)
		exec := cfg.exec(fm)
		if exec > fm.slo || cfg.quota(fm.model.WeightsBytes) > cfg.Node.MaxGPUMemory() {
			continue // never on time, or never on a GPU
		}
		maxSLO = max(maxSLO, fm.slo)
		p := fm.model.Percentile
		if p == 0 {
			p = contract.DefaultPercentile
		}
		need := math.Ceil(p/100*float64(n) - 1e-9)
		sec := need * exec.Seconds()
		if !cfg.Prewarm {
			alone := cfg.Node.TransferTime(fm.model.WeightsBytes, topology.HostPath(0), nil)
			sec += swapPenalty(fm.betaPCIe, alone, alone).Seconds()
		}
		least = append(least, sec)
	}
	slices.Sort(least)
	b.CapacityGPUSeconds = float64(len(cfg.Node.GPUs)) * (span + maxSLO).Seconds()
	sum := 0.0
	for _, d := range least {
		b.DemandGPUSeconds += d
		if sum+d <= b.CapacityGPUSeconds {
			sum += d
			b.Functions++
		}
	}
	if b.FunctionsWithTraffic > 0 {
		b.Share = float64(b.Functions) / float64(b.FunctionsWithTraffic)
	}
	return b, nil
}
