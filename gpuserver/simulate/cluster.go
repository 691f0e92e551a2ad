package simulate

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/router"
)

// Defaults of ClusterConfig.
const (
	DefaultProvisionDelay   = time.Minute
	DefaultImageLoadLatency = time.Second
	DefaultImageLoadRate    = 1e9 // bytes per second from storage into a node's host memory
	DefaultHostMemoryBytes  = 384e9
)

// ClusterConfig is one run of a cluster of identical nodes (Config.Node each) behind the router.
type ClusterConfig struct {
	Config
	// Nodes is the number of nodes at the start (without autoscaling, throughout).
	Nodes int
	// Autoscale adds and drains nodes (router.Autoscaler with AutoscaleConfig).
	Autoscale       bool
	AutoscaleConfig router.AutoscaleConfig
	// ProvisionDelay: a node added serves after it (and counts as provisioned from the decision).
	ProvisionDelay time.Duration
	// ImageLoadLatency and ImageLoadRate: a request routed to a node without its function's host image waits
	// for the image to load from storage (placement or replication).
	ImageLoadLatency time.Duration
	ImageLoadRate    float64
	// HostMemoryBytes per node for host images (least recently used dropped beyond it).
	HostMemoryBytes uint64
	// RoundRobin routes requests round robin instead of to the best node (router.Config.RoundRobin).
	RoundRobin bool
}

// ClusterResult is the outcome of a cluster run.
type ClusterResult struct {
	Name                 string  `json:"name"`
	Node                 string  `json:"node"`
	Functions            int     `json:"functions"`
	FunctionsWithTraffic int     `json:"functions_with_requests"`
	FunctionsSLOMet      int     `json:"functions_slo_met"`
	FunctionsSLOMetShare float64 `json:"functions_slo_met_share"`
	Requests             int64   `json:"requests"`
	RequestsOnTime       int64   `json:"requests_on_time"`
	Rejected             int64   `json:"requests_rejected"`
	Shed                 int64   `json:"requests_shed_by_a_node"`
	P99                  float64 `json:"latency_p99_over_deadline"`
	Autoscale            bool    `json:"autoscale"`
	NodesStart           int     `json:"nodes_start"`
	NodesPeak            int     `json:"nodes_peak"`
	GPUsPeak             int     `json:"gpus_peak"`
	// GPUsMean is the GPUs provisioned on average over the run (GPU time / simulated time).
	GPUsMean   float64 `json:"gpus_mean"`
	NodesAdded int     `json:"nodes_added"`
	NodesGone  int     `json:"nodes_drained"`
	// ImageLoads counts host images loaded on a node at a request (placements and replications).
	ImageLoads       int64   `json:"image_loads"`
	RoutedResident   int64   `json:"routed_to_resident"`
	Events           int64   `json:"events"`
	SimulatedSeconds float64 `json:"simulated_seconds"`
	WallSeconds      float64 `json:"wall_seconds"`
	EventsPerSecond  float64 `json:"events_per_second"`
	// Stopped: the run ended early (Config.StopBelow), at SimulatedSeconds; the figures count only what finished
	// until then.
	Stopped bool `json:"stopped_early,omitempty"`
	// Timeline samples the nodes provisioned (serving, starting and draining) at every autoscaling tick.
	Timeline []NodesAt `json:"timeline,omitempty"`
}

// NodesAt is the number of nodes provisioned at a time.
type NodesAt struct {
	Seconds float64 `json:"s"`
	Nodes   int     `json:"nodes"`
}

type clusterNode struct {
	sim       *simNode
	rt        int // router index; -1 while provisioning
	added     time.Duration
	removed   time.Duration // never while provisioned
	readyAt   time.Duration
	gpus      int
	nativeFns []bool
}

// RunCluster simulates cfg's policy on a cluster. Native binding places each function's process on one node for
// the whole run (first fit by memory); every other policy late-binds on every node and routes through the router.
func RunCluster(cfg ClusterConfig) (ClusterResult, error) {
	if err := cfg.check(); err != nil {
		return ClusterResult{}, err
	}
	if cfg.Nodes <= 0 {
		return ClusterResult{}, fmt.Errorf("%w: nodes: must be > 0", ErrInvalidInput)
	}
	if cfg.Config.Autoscale { // in a cluster the OpenFaaS or Knative autoscaler scales instances, not up's
		return ClusterResult{}, fmt.Errorf("%w: autoscale: instances are autoscaled on one node only; a cluster "+
			"runs static instances (Config.Instances)", ErrInvalidInput)
	}
	cfg.ProvisionDelay = cmp.Or(cfg.ProvisionDelay, DefaultProvisionDelay)
	cfg.ImageLoadLatency = cmp.Or(cfg.ImageLoadLatency, DefaultImageLoadLatency)
	cfg.ImageLoadRate = cmp.Or(cfg.ImageLoadRate, DefaultImageLoadRate)
	cfg.HostMemoryBytes = cmp.Or(cfg.HostMemoryBytes, DefaultHostMemoryBytes)
	if cfg.ProvisionDelay < 0 || cfg.ImageLoadLatency < 0 || !(cfg.ImageLoadRate > 0) {
		return ClusterResult{}, fmt.Errorf("%w: provision delay, image load latency and rate must be > 0",
			ErrInvalidInput)
	}
	native := cfg.Policy.Pinned() // native or static: each function pinned to a node and a GPU for the run
	if native && cfg.Autoscale {
		return ClusterResult{}, fmt.Errorf("%w: %s pins functions to nodes and does not autoscale",
			ErrInvalidInput, cfg.Policy)
	}
	start := time.Now()
	e, err := newEngine(&cfg.Config, false)
	if err != nil {
		return ClusterResult{}, err
	}
	rt, err := router.New(router.Config{RoundRobin: cfg.RoundRobin})
	if err != nil {
		return ClusterResult{}, err
	}
	var auto *router.Autoscaler
	if cfg.Autoscale {
		if auto, err = router.NewAutoscaler(cfg.AutoscaleConfig); err != nil {
			return ClusterResult{}, err
		}
	}
	arrivals := cfg.Arrivals
	if arrivals == nil {
		arrivals = cfg.arrivals()
	}
	gpus := len(cfg.Node.GPUs)
	res := ClusterResult{Name: string(cfg.Policy), Node: cfg.Node.Name, Functions: cfg.Functions,
		Autoscale: cfg.Autoscale, NodesStart: cfg.Nodes, Requests: int64(len(arrivals))}
	perFn := make([][2]int64, cfg.Functions)
	norm := make([]float64, 0, len(arrivals))
	var nodes []*clusterNode
	byRouter := map[int]*clusterNode{}
	provisioned := func() int {
		k := 0
		for _, cn := range nodes {
			if cn.removed == never {
				k++
			}
		}
		return k
	}
	addNode := func(register func(int) bool) error {
		sn, err := e.addNode(register)
		if err != nil {
			return err
		}
		nodes = append(nodes, &clusterNode{sim: sn, rt: -1, added: e.now, removed: never,
			readyAt: e.now, gpus: gpus})
		res.NodesPeak = max(res.NodesPeak, provisioned())
		return nil
	}
	serve := func(cn *clusterNode) {
		cn.rt = rt.AddNode(epoch.Add(e.now), fmt.Sprintf("node-%d", cn.sim.index), gpus, cfg.HostMemoryBytes)
		byRouter[cn.rt] = cn
	}
	var home []int // native and static: each function's node
	switch {
	case cfg.Policy == controller.PolicyStatic || cfg.Policy == controller.PolicyStaticDeadline:
		var gpus [][]int
		home, gpus = placeStatic(&cfg, e.fns, arrivals, cfg.Nodes)
		e.pin = func(fn int) []int { return gpus[fn] }
	case native:
		home = placeNative(&cfg, e.fns, cfg.Nodes)
	}
	for i := range cfg.Nodes {
		var reg func(int) bool
		if native {
			reg = func(fn int) bool { return home[fn] == i }
		}
		if err := addNode(reg); err != nil {
			return ClusterResult{}, err
		}
		serve(nodes[i])
	}
	for _, fm := range e.fns {
		rt.Register(epoch, fm.name, fm.model.WeightsBytes)
	}
	view := residency{nodes: byRouter, instances: cfg.Instances > 1}
	e.rejected = func(ri *reqInfo) {
		delete(e.reqs, ri.id)
		if ri.node >= 0 && !native { // dropped by a node's overload control while it waited there
			cn := nodes[ri.node]
			_ = rt.Finished(cn.rt)
			noteRemoved(rt, cn, e.now)
		}
		res.Rejected++
		perFn[ri.fn][0]++
		e.missed(ri.fn)
		if auto != nil {
			auto.Refused()
		}
	}
	var route func(ri *reqInfo)
	shed := func(cn *clusterNode, ri *reqInfo, err error) {
		var oe *pool.OverloadedError
		retry := controller.DefaultShedEvery
		if errors.As(err, &oe) {
			retry = oe.RetryAfter
		}
		res.Shed++
		_ = rt.Shed(cn.rt, e.fns[ri.fn].name, epoch.Add(e.now+retry))
		noteRemoved(rt, cn, e.now)
	}
	route = func(ri *reqInfo) {
		name := e.fns[ri.fn].name
		if native {
			if home[ri.fn] < 0 || e.submit(nodes[home[ri.fn]].sim, ri) != nil {
				e.reject(ri)
			}
			return
		}
		for range len(nodes) + 1 {
			pick, err := rt.Route(epoch.Add(e.now), name, view)
			if err != nil {
				e.reject(ri)
				return
			}
			cn := byRouter[pick.Node]
			if pick.LoadImage {
				res.ImageLoads++
				load := cfg.ImageLoadLatency + time.Duration(float64(e.fns[ri.fn].model.WeightsBytes)/
					cfg.ImageLoadRate*float64(time.Second))
				e.deliverLater(cn.sim, ri, load)
				return
			}
			err = e.submit(cn.sim, ri)
			if err == nil {
				return
			}
			if !errors.Is(err, pool.ErrOverloaded) {
				_ = rt.Finished(cn.rt)
				noteRemoved(rt, cn, e.now)
				e.reject(ri)
				return
			}
			shed(cn, ri, err)
		}
		e.reject(ri)
	}
	e.arrive = route
	e.deliver = func(n *simNode, ri *reqInfo) {
		delete(e.reqs, ri.id)
		cn := nodes[n.index]
		err := e.submit(n, ri)
		switch {
		case err == nil:
		case errors.Is(err, pool.ErrOverloaded):
			shed(cn, ri, err)
			route(ri)
		default:
			_ = rt.Finished(cn.rt)
			noteRemoved(rt, cn, e.now)
			e.reject(ri)
		}
	}
	e.finished = func(ri *reqInfo, onTime bool, lat, held time.Duration) {
		perFn[ri.fn][0]++
		if onTime {
			perFn[ri.fn][1]++
			res.RequestsOnTime++
		} else {
			e.missed(ri.fn)
		}
		norm = append(norm, float64(lat)/float64(e.fns[ri.fn].slo))
		if !native {
			cn := nodes[ri.node]
			_ = rt.Finished(cn.rt)
			noteRemoved(rt, cn, e.now)
		}
		if auto != nil {
			auto.Observe(onTime, held)
		}
	}
	if auto != nil {
		var pending []*clusterNode
		e.addTicker(auto.Every(), func() error {
			for len(pending) > 0 && pending[0].readyAt <= e.now {
				serve(pending[0])
				pending = pending[1:]
			}
			serving := rt.Serving()
			switch auto.Decide(epoch.Add(e.now), serving, len(pending), gpus) {
			case router.AddNode:
				if addNode(nil) == nil {
					cn := nodes[len(nodes)-1]
					cn.readyAt = e.now + cfg.ProvisionDelay
					pending = append(pending, cn)
					res.NodesAdded++
				}
			case router.DrainNode:
				if i := rt.Least(); i >= 0 {
					_ = rt.Drain(i)
					noteRemoved(rt, byRouter[i], e.now)
					res.NodesGone++
				}
			}
			res.Timeline = append(res.Timeline, NodesAt{Seconds: e.now.Seconds(), Nodes: provisioned()})
			return nil
		})
	}
	e.watchFloor(arrivals)
	if err := e.run(arrivals); err != nil {
		return ClusterResult{}, err
	}
	end := e.now
	res.Stopped = e.stopped
	var gpuTime time.Duration
	for _, cn := range nodes {
		gpuTime += time.Duration(cn.gpus) * (min(cn.removed, end) - cn.added)
	}
	if end > 0 {
		res.GPUsMean = gpuTime.Seconds() / end.Seconds()
	}
	res.GPUsPeak = res.NodesPeak * gpus
	res.FunctionsWithTraffic, res.FunctionsSLOMet = e.compliance(perFn)
	if res.FunctionsWithTraffic > 0 {
		res.FunctionsSLOMetShare = float64(res.FunctionsSLOMet) / float64(res.FunctionsWithTraffic)
	}
	sort.Float64s(norm)
	res.P99 = quantile(norm, 0.99)
	res.RoutedResident = rt.Counters().Resident
	res.Events, res.SimulatedSeconds = e.events, end.Seconds()
	res.WallSeconds = time.Since(start).Seconds()
	if res.WallSeconds > 0 {
		res.EventsPerSecond = float64(res.Events) / res.WallSeconds
	}
	return res, nil
}

// noteRemoved records when a drained node's last request finished.
func noteRemoved(rt *router.Router, cn *clusterNode, now time.Duration) {
	if cn.rt >= 0 && cn.removed == never && rt.Nodes()[cn.rt].State == router.Removed {
		cn.removed = now
	}
}

// residency answers the router from the nodes' controllers.
type residency struct {
	nodes     map[int]*clusterNode
	instances bool // functions have several instances: any of them resident counts
}

func (r residency) Resident(node int, function string) bool {
	cn := r.nodes[node]
	if cn == nil {
		return false
	}
	if cn.sim.ctl.Resident(function) {
		return true
	}
	return r.instances && cn.sim.ctl.InstanceResident(function)
}

// placeStatic packs the functions onto the nodes' GPUs for good, as an operator sizing a static deployment would
// with the whole run's arrivals known. Each function goes to one node (its host image lives there): functions in
// decreasing order of GPU demand (requests x the execution time it is charged) onto the node with the least demand so far
// that has room for a copy. Within a node, each function first gets one copy on the GPU with the least demand
// that has room; the memory left then holds extra copies, each time of the function with the most demand per copy
// that fits on one more GPU, so that hot models run on several GPUs. It returns each function's node (-1 when none
// has room) and GPUs.
func placeStatic(cfg *ClusterConfig, fns []fnModel, arrivals []Arrival, nodes int) (home []int, gpus [][]int) {
	demand := make([]float64, len(fns))
	for _, a := range arrivals {
		demand[a.Function] += cfg.exec(fns[a.Function]).Seconds()
	}
	order := make([]int, len(fns))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return demand[order[a]] > demand[order[b]] })
	g := len(cfg.Node.GPUs)
	used := make([]uint64, nodes*g)
	load := make([]float64, nodes*g)
	nodeLoad := make([]float64, nodes)
	home, gpus = make([]int, len(fns)), make([][]int, len(fns))
	need := func(f int) uint64 { return cfg.quota(fns[f].model.WeightsBytes) }
	fits := func(k, f int) bool { return cfg.Node.GPUs[k%g].MemoryBytes-used[k] >= need(f) }
	for _, f := range order {
		home[f] = -1
		best := -1
		for k := range used {
			if fits(k, f) && (best < 0 || nodeLoad[k/g] < nodeLoad[best/g] ||
				nodeLoad[k/g] == nodeLoad[best/g] && load[k] < load[best]) {
				best = k
			}
		}
		if best < 0 {
			continue
		}
		// The least loaded GPU with room on the chosen node.
		for k := best / g * g; k < best/g*g+g; k++ {
			if fits(k, f) && load[k] < load[best] {
				best = k
			}
		}
		used[best] += need(f)
		load[best] += demand[f]
		nodeLoad[best/g] += demand[f]
		home[f], gpus[f] = best/g, []int{best % g}
	}
	for {
		bestF, bestK := -1, -1
		for _, f := range order {
			if home[f] < 0 || demand[f] == 0 || bestF >= 0 && demand[f]/float64(len(gpus[f])) <=
				demand[bestF]/float64(len(gpus[bestF])) {
				continue
			}
			k := -1
			for c := home[f] * g; c < home[f]*g+g; c++ {
				if fits(c, f) && !slices.Contains(gpus[f], c%g) && (k < 0 || load[c] < load[k]) {
					k = c
				}
			}
			if k >= 0 {
				bestF, bestK = f, k
			}
		}
		if bestF < 0 {
			return home, gpus
		}
		used[bestK] += need(bestF)
		gpus[bestF] = append(gpus[bestF], bestK%g)
	}
}

// placeNative assigns each function to the first of the nodes with a GPU that has room for it with its own
// context (the least used such GPU, as the controller pins), or -1 when none has; functions are placed in order.
func placeNative(cfg *ClusterConfig, fns []fnModel, nodes int) []int {
	used := make([][]uint64, nodes)
	for i := range used {
		used[i] = make([]uint64, len(cfg.Node.GPUs))
	}
	home := make([]int, len(fns))
	for f, fm := range fns {
		home[f] = -1
		need := cfg.quota(fm.model.WeightsBytes) + controller.DefaultContextBytes
		for n := range used {
			best := -1
			for g, gpu := range cfg.Node.GPUs {
				if gpu.MemoryBytes-used[n][g] >= need && (best < 0 || used[n][g] < used[n][best]) {
					best = g
				}
			}
			if best >= 0 {
				used[n][best] += need
				home[f] = n
				break
			}
		}
	}
	return home
}
