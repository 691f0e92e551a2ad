package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// simReport is the --json output of faas-gpu sim.
type simReport struct {
	Trace     string            `json:"trace"`
	Models    string            `json:"models"`
	Node      string            `json:"node"`
	Functions int               `json:"functions"`
	Minutes   int               `json:"minutes"`
	Seed      uint64            `json:"seed"`
	Policies  []simulate.Result `json:"policies"`
	// Bound is the offline upper bound on SLO-compliant functions (of the first policy's execution times).
	Bound simulate.Bound `json:"offline_bound"`
	// Cluster holds the results of --nodes or --autoscale runs instead of Policies.
	Cluster []simulate.ClusterResult `json:"cluster,omitempty"`
}

func runSim(ctx context.Context, args []string, stdout, _ io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	trace := fs.String("trace", "", "invocation trace CSV (one row per function, one column per minute)")
	arrivalsArg := fs.String("arrivals", "", "explicit arrivals CSV (at_ms,function index) instead of --trace")
	models := fs.String("models", "", "model profile CSV (Torpor or Clockwork layout)")
	functions := fs.Int("functions", 0, "number of functions (models assigned round-robin)")
	nodeArg := fs.String("node", "v100x4", "node preset ("+strings.Join(topology.PresetNames(), ", ")+") or node file")
	minutes := fs.Int("minutes", 10, "simulated minutes of the trace (beyond its length it repeats)")
	policies := fs.String("policies", string(controller.PolicyFaaSGPU), "comma-separated policies")
	seed := fs.Uint64("seed", 1, "random seed (arrivals, sampling, random placement)")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	instances := fs.Int("instances", 0, "static instances (replicas) of each function, each placed on its own with "+
		"a copy of its own, the autoscaler off: what up gives a function deployed with com.openfaas.scale.min N and "+
		"no other scale label (0: the autoscaler's, --autoscale-instances)")
	var product simProductFlags
	product.register(fs)
	maxInFlight := fs.Int("max-in-flight", simulate.DefaultMaxInFlight, "requests each instance serves at once "+
		"(the product: 1); 0 is unlimited, which the product CANNOT do: a function's requests then share its copies "+
		"on every GPU as if it had an instance per GPU (the figures docs/bench/policy.md reported before instances)")
	gpuMemory := fs.String("gpu-memory", "", "override every GPU's memory, e.g. 16Gi")
	nodes := fs.Int("nodes", 0, "simulate a cluster of this many nodes behind the router (0: one node)")
	autoscale := fs.Bool("autoscale", false, "cluster: add nodes when SLO attainment drops, drain idle ones (the "+
		"functions' instances are then static, --instances)")
	keepAlive := fs.Duration("keep-alive", simulate.DefaultKeepAlive,
		"cluster: how long the keepalive baseline keeps an idle instance (a GPU each)")
	partial := fs.Bool("partial-residency", false, "keep evicted models' blocks on the GPU while memory allows")
	memFactor := fs.Float64("memory-factor", simulate.DefaultMemoryFactor,
		"a function's GPU memory quota as a multiple of its model's weights (>= 1)")
	overloadArg := fs.String("overload", controller.OverloadAuto, overloadUsage)
	startMinute := fs.Int("start-minute", 0, "the trace's minute the replay starts at, e.g. 60 for its second hour")
	admissionArg := fs.String("admission", string(controller.DefaultAdmission), admissionUsage)
	assign := fs.String("assign", simulate.AssignRoundRobin, "models to functions: round-robin, or seeded (drawn per seed)")
	arrivalCV := fs.Float64("arrival-cv", 0, "Gamma inter-arrival times of this coefficient of variation, rate from the "+
		"trace (0: Poisson within each minute)")
	alpha := fs.Float64("alpha", 0, "fix the Torpor grouping's alpha, e.g. 0.01 (0: re-tuned)")
	remoted := fs.Bool("remoted-times", false, "charge every policy the remoted execution times (native and static too)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	flagErr := func(name string, err error) error { return usageError{fmt.Errorf("-%s: %w", name, err)} }
	switch {
	case *trace == "" && *arrivalsArg == "":
		return flagErr("trace", errors.New("required (or --arrivals)"))
	case *trace != "" && *arrivalsArg != "":
		return flagErr("arrivals", errors.New("give --trace or --arrivals, not both"))
	case *models == "":
		return flagErr("models", errors.New("required"))
	case *functions < 0 || *functions == 0 && *arrivalsArg == "":
		return flagErr("functions", errors.New("must be > 0"))
	case *minutes <= 0:
		return flagErr("minutes", errors.New("must be > 0"))
	case *maxInFlight < 0:
		return flagErr("max-in-flight", errors.New("must be >= 0"))
	case *instances < 0 || *instances > 1024:
		return flagErr("instances", errors.New("must be in [0, 1024]"))
	case !(*memFactor >= 1) || math.IsInf(*memFactor, 0):
		return flagErr("memory-factor", errors.New("must be >= 1"))
	case *nodes < 0:
		return flagErr("nodes", errors.New("must be >= 0"))
	case *keepAlive <= 0:
		return flagErr("keep-alive", errors.New("must be > 0"))
	}
	overload, err := controller.ParseOverload(*overloadArg)
	if err != nil {
		return flagErr("overload", err)
	}
	if *startMinute < 0 {
		return flagErr("start-minute", errors.New("must be >= 0"))
	}
	admission, err := parseAdmission(*admissionArg)
	if err != nil {
		return err
	}
	switch {
	case *assign != simulate.AssignRoundRobin && *assign != simulate.AssignSeeded:
		return flagErr("assign", fmt.Errorf("%q: want %s or %s", *assign, simulate.AssignRoundRobin, simulate.AssignSeeded))
	case !(*arrivalCV >= 0 && *arrivalCV <= 100):
		return flagErr("arrival-cv", errors.New("must be in [0, 100]"))
	case !(*alpha >= 0 && *alpha <= 1):
		return flagErr("alpha", errors.New("must be in [0, 1]"))
	}
	var pols []controller.Policy
	for _, p := range strings.Split(*policies, ",") {
		pol, err := controller.ParsePolicy(strings.TrimSpace(p))
		if err != nil {
			return flagErr("policies", err)
		}
		pols = append(pols, pol)
	}
	node, err := topology.Resolve(*nodeArg)
	if err != nil {
		return flagErr("node", err)
	}
	if *gpuMemory != "" {
		size, err := topology.ParseSize(*gpuMemory)
		if err != nil {
			return flagErr("gpu-memory", err)
		}
		if node, err = node.WithGPUMemory(size); err != nil {
			return flagErr("gpu-memory", err)
		}
	}
	var tr *simulate.Trace
	var arrivals []simulate.Arrival
	if *arrivalsArg != "" {
		if arrivals, err = simulate.LoadArrivals(*arrivalsArg); err != nil {
			return flagErr("arrivals", err)
		}
		most := 0
		for _, a := range arrivals {
			most = max(most, a.Function+1)
		}
		switch {
		case *functions == 0:
			*functions = most
		case *functions < most:
			return flagErr("functions", fmt.Errorf("%d, but the arrivals name function %d", *functions, most-1))
		}
		*trace, *minutes = *arrivalsArg, 0
	} else {
		if tr, err = simulate.LoadTrace(*trace); err != nil {
			return flagErr("trace", err)
		}
	}
	ms, err := simulate.LoadModels(*models)
	if err != nil {
		return flagErr("models", err)
	}
	rep := simReport{Trace: *trace, Models: *models, Node: node.Name, Functions: *functions, Minutes: *minutes,
		Seed: *seed}
	for i, p := range pols {
		if err := ctx.Err(); err != nil {
			return err
		}
		cfg := simulate.Config{Trace: tr, Models: ms, Functions: *functions, Node: node,
			Minutes: *minutes, Policy: p, Seed: *seed, MaxInFlight: *maxInFlight, Arrivals: arrivals, Instances: *instances,
			MemoryFactor: *memFactor, PartialResidency: *partial, Overload: overload, StartMinute: *startMinute,
			Admission: admission, Assign: *assign, ArrivalCV: *arrivalCV, Alpha: *alpha, RemotedTimes: *remoted}
		if err := product.apply(&cfg, *instances, *nodes > 0 || *autoscale); err != nil {
			return err
		}
		if *nodes > 0 || *autoscale {
			var r simulate.ClusterResult
			if p == controller.PolicyKeepAlive {
				r, err = simulate.RunKeepAlive(simulate.KeepAliveConfig{Config: cfg, KeepAlive: *keepAlive})
			} else {
				r, err = simulate.RunCluster(simulate.ClusterConfig{Config: cfg, Nodes: max(1, *nodes),
					Autoscale: *autoscale})
			}
			if err != nil {
				return fmt.Errorf("simulate %s: %w", p, err)
			}
			rep.Cluster = append(rep.Cluster, r)
			continue
		}
		if i == 0 {
			if rep.Bound, err = simulate.OfflineBound(cfg); err != nil {
				return fmt.Errorf("offline bound: %w", err)
			}
		}
		r, err := simulate.Run(cfg, false)
		if err != nil {
			return fmt.Errorf("simulate %s: %w", p, err)
		}
		rep.Policies = append(rep.Policies, r)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	if rep.Cluster != nil {
		return writeClusterTable(stdout, rep)
	}
	return writeSimTable(stdout, rep)
}

func writeClusterTable(w io.Writer, rep simReport) error {
	fmt.Fprintf(w, "cluster of %s nodes, %d functions, %d minutes, seed %d\n", rep.Node, rep.Functions, rep.Minutes,
		rep.Seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tfunctions within SLO\trequests\twithin SLO\trefused\tGPUs mean\tGPUs peak\tnodes start/peak\timage loads\tevents/s\t")
	for _, r := range rep.Cluster {
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%d\t%d\t%.1f\t%d\t%d/%d\t%d\t%.0f\t\n", r.Name, r.FunctionsSLOMet,
			r.FunctionsWithTraffic, r.Requests, r.RequestsOnTime, r.Rejected, r.GPUsMean, r.GPUsPeak, r.NodesStart,
			r.NodesPeak, r.ImageLoads, r.EventsPerSecond)
	}
	return tw.Flush()
}

func writeSimTable(w io.Writer, rep simReport) error {
	fmt.Fprintf(w, "node %s, %d functions, %d minutes, seed %d\n", rep.Node, rep.Functions, rep.Minutes, rep.Seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tfunctions within SLO\trequests\twithin SLO\tp50/ddl\tp98/ddl\tp99/ddl\tswaps none/nvlink/pcie\tevictions ctl/pressure\tcold\trefused\tinstances mean/peak\tGPU busy\t")
	for _, r := range rep.Policies {
		busy := make([]string, len(r.GPUBusy))
		for i, b := range r.GPUBusy {
			busy[i] = fmt.Sprintf("%.2f", b)
		}
		inst := "-"
		if a := r.Autoscaler; a != nil {
			inst = fmt.Sprintf("%.1f/%d", a.Mean, a.Peak)
		}
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%d\t%.2f\t%.2f\t%.2f\t%d/%d/%d\t%d/%d\t%d\t%d\t%s\t%s\t\n", r.Name,
			r.FunctionsSLOMet, r.FunctionsWithTraffic, r.Requests, r.RequestsOnTime, r.P50, r.P98, r.P99, r.Swaps.None,
			r.Swaps.NVLink, r.Swaps.PCIe, r.Evictions, r.DataPlaneEvictions["pressure"], r.ColdStarts, r.Rejected, inst,
			strings.Join(busy, " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b := rep.Bound
	_, err := fmt.Fprintf(w, "offline bound: %d/%d functions (least GPU time %.0f s of %.0f s)\n", b.Functions,
		b.FunctionsWithTraffic, b.DemandGPUSeconds, b.CapacityGPUSeconds)
	return err
}
