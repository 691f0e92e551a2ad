// Command instcost runs faas-gpu with the admission rule as shipped (simulate.Product) on one trace window and
// prints what its instances cost: figures, swaps by kind, evictions by who decided them, instances.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "instcost:", err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("workloads", "../shared/workloads", "workloads")
	trace := flag.String("trace", "torpor-203fn-31min.csv", "trace")
	fns := flag.Int("functions", 560, "functions")
	minutes := flag.Int("minutes", 10, "minutes")
	start := flag.Int("start", 0, "start minute")
	seed := flag.Uint64("seed", 1, "seed")
	variants := flag.String("variants", "shipped", "comma list: shipped, one, shared, nodp, unlimited, max4")
	flag.Parse()
	tr, err := simulate.LoadTrace(filepath.Join(*dir, *trace))
	if err != nil {
		return err
	}
	ms, err := simulate.LoadModels(filepath.Join(*dir, "models-torpor-v100.csv"))
	if err != nil {
		return err
	}
	node, err := topology.Preset("v100x4")
	if err != nil {
		return err
	}
	base := simulate.Config{Trace: tr, Models: ms, Functions: *fns, Node: node, Minutes: *minutes,
		StartMinute: *start, Seed: *seed, Assign: simulate.AssignSeeded}
	arr, err := simulate.TraceArrivals(base)
	if err != nil {
		return err
	}
	for _, v := range strings.Split(*variants, ",") {
		cfg := simulate.Product(base)
		cfg.Arrivals = arr
		cfg.Policy, cfg.Admission = controller.PolicyFaaSGPU, controller.AdmissionDeadline
		switch v {
		case "shipped":
		case "one":
			cfg.Autoscale, cfg.Instances = false, 1
		case "shared":
			cfg.ModelShared = true
		case "nodp":
			cfg.DataPlane = false
		case "unlimited":
			cfg.Autoscale, cfg.Instances, cfg.MaxInFlight, cfg.DataPlane = false, 1, 0, false
		default:
			return fmt.Errorf("variant %q", v)
		}
		r, err := simulate.Run(cfg, false)
		if err != nil {
			return err
		}
		inst, ups := 0.0, int64(0)
		if a := r.Autoscaler; a != nil {
			inst, ups = a.Mean, a.Ups
		}
		fmt.Printf("%-10s fn %.3f req %.4f refused %d swaps none %d nv %d pcie %d evict %d dp %v inst %.1f ups %d wall %.0fs\n",
			v, r.FunctionsSLOMetShare, float64(r.RequestsOnTime)/float64(r.Requests), r.Rejected, r.Swaps.None,
			r.Swaps.NVLink, r.Swaps.PCIe, r.Evictions, r.DataPlaneEvictions, inst, ups, r.WallSeconds)
	}
	return nil
}
