package simulate

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// DefaultKeepAlive is how long a keep-alive instance stays warm after its last request.
const DefaultKeepAlive = 10 * time.Minute

// KeepAliveConfig is the keep-alive baseline on dedicated GPUs: every warm function instance holds a GPU of its
// own (no sharing), as serverless platforms without late binding do.
type KeepAliveConfig struct {
	Config
	// KeepAlive is how long an idle instance stays warm; 0 means DefaultKeepAlive.
	KeepAlive time.Duration
	// Prewarmed starts, for every function with traffic, as many warm instances as it ever has requests running
	// at once (known offline from the arrivals) and never lets one go: the only way keep-alive keeps functions
	// within their SLO, since a cold start misses it.
	Prewarmed bool
}

// RunKeepAlive simulates the baseline: a request runs on a free warm instance of its function, else it cold
// starts a new instance on a new GPU (Torpor's cold-start cost in the controller's model: 3 s plus the model
// loaded at 1 GB/s, then the native execution time); an instance is released KeepAlive after its last request.
// GPUs are counted as instances alive: on average over the run and at the peak.
func RunKeepAlive(cfg KeepAliveConfig) (ClusterResult, error) {
	if err := cfg.check(); err != nil {
		return ClusterResult{}, err
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.KeepAlive < 0 {
		return ClusterResult{}, fmt.Errorf("%w: keep-alive must be > 0", ErrInvalidInput)
	}
	start := time.Now()
	ref, err := topology.Preset("v100x4")
	if err != nil {
		return ClusterResult{}, err
	}
	arrivals := cfg.Arrivals
	if arrivals == nil {
		arrivals = cfg.arrivals()
	}
	type instance struct {
		freeAt, lastUsed, created time.Duration
	}
	e := &engine{cfg: &cfg.Config, fns: make([]fnModel, cfg.Functions)}
	for i := range e.fns {
		e.fns[i] = cfg.fnModel(i, &ref)
	}
	var end, gpuTime time.Duration
	var changes []change // instance lifetimes for the peak: +1 at creation, -1 at release
	insts := make([][]*instance, cfg.Functions)
	name := "keepalive"
	if cfg.Prewarmed {
		name = "keepalive-prewarmed"
		running := make([][]time.Duration, cfg.Functions) // ends of each function's requests in progress
		for _, a := range arrivals {
			ends := running[a.Function][:0]
			for _, end := range running[a.Function] {
				if end > a.At {
					ends = append(ends, end)
				}
			}
			running[a.Function] = append(ends, a.At+e.fns[a.Function].model.Native)
			for len(insts[a.Function]) < len(running[a.Function]) {
				insts[a.Function] = append(insts[a.Function], &instance{})
				changes = append(changes, change{0, +1})
			}
		}
	}
	res := ClusterResult{Name: name, Node: "one GPU per instance", Functions: cfg.Functions,
		Requests: int64(len(arrivals))}
	perFn := make([][2]int64, cfg.Functions)
	release := func(in *instance) time.Duration {
		if cfg.Prewarmed {
			return never
		}
		return in.lastUsed + cfg.KeepAlive
	}
	for _, a := range arrivals {
		fm := e.fns[a.Function]
		exec := fm.model.Native
		var pick *instance
		list := insts[a.Function][:0]
		for _, in := range insts[a.Function] { // drop instances released before this arrival
			if r := release(in); r < a.At {
				gpuTime += r - in.created
				changes = append(changes, change{r, -1})
				continue
			}
			list = append(list, in)
			if pick == nil && in.freeAt <= a.At {
				pick = in
			}
		}
		insts[a.Function] = list
		lat := exec
		if pick == nil {
			lat += controller.DefaultColdStart + time.Duration(float64(fm.model.WeightsBytes)/1e9*float64(time.Second))
			pick = &instance{created: a.At}
			insts[a.Function] = append(insts[a.Function], pick)
			changes = append(changes, change{a.At, +1})
		}
		pick.freeAt, pick.lastUsed = a.At+lat, a.At+lat
		end = max(end, a.At+lat)
		perFn[a.Function][0]++
		res.Events++
		if lat <= fm.slo {
			perFn[a.Function][1]++
			res.RequestsOnTime++
		}
	}
	for _, list := range insts {
		for _, in := range list {
			r := min(release(in), end)
			gpuTime += r - in.created
			changes = append(changes, change{r, -1})
		}
	}
	res.GPUsPeak = peakAlive(changes)
	if end > 0 {
		res.GPUsMean = gpuTime.Seconds() / end.Seconds()
	}
	res.FunctionsWithTraffic, res.FunctionsSLOMet = e.compliance(perFn)
	if res.FunctionsWithTraffic > 0 {
		res.FunctionsSLOMetShare = float64(res.FunctionsSLOMet) / float64(res.FunctionsWithTraffic)
	}
	res.SimulatedSeconds = end.Seconds()
	res.WallSeconds = time.Since(start).Seconds()
	return res, nil
}

type change struct {
	at    time.Duration
	delta int
}

// peakAlive is the most instances alive at once (a release before a creation at the same instant).
func peakAlive(changes []change) int {
	slices.SortFunc(changes, func(a, b change) int {
		if a.at != b.at {
			return cmp.Compare(a.at, b.at)
		}
		return a.delta - b.delta
	})
	alive, peak := 0, 0
	for _, c := range changes {
		alive += c.delta
		peak = max(peak, alive)
	}
	return peak
}
