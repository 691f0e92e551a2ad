package main

import (
	"fmt"
	"strings"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
)

// The product's behaviour around the controller: every late-binding run has what `up` and the
// gpuserver do, simulate.Product: one request in flight per instance, up's autoscaler over every function (the
// labels min 1 and max 10, target 1, proportion 1.0, a 40 s scale-down window, instances serving 2 s after they
// are asked for), and the data plane's own evictions under memory pressure. The product sweep sets the variants
// that differ from it beside it, down to the unlimited node the benchmark simulated before.

// asShipped gives cfg the product's behaviour for variant v: simulate.Product, except for pinned policies (native,
// static: a process per function for good, whose requests share its GPU as before) and for a variant with an
// in-flight limit per function (torpor's router: one instance, not autoscaled) and for a sweep that gives static
// instances (Config.Instances > 0: functions deployed without scale labels); then the variant's shape.
func asShipped(cfg *simulate.Config, v variant) {
	if v.policy.Pinned() {
		cfg.MaxInFlight = v.inFlight
		return
	}
	static := cfg.Instances // a sweep of functions without scale labels (torpor-arrivals)
	*cfg = simulate.Product(*cfg)
	if static > 0 {
		cfg.Autoscale, cfg.Instances = false, static
	}
	if v.inFlight > 0 {
		cfg.Autoscale, cfg.Instances, cfg.MaxInFlight = false, 1, v.inFlight
	}
	if v.shape != nil {
		v.shape(cfg)
	}
}

// clusterConcurrency is the cluster runs' concurrency: in a cluster the OpenFaaS or Knative autoscaler scales a
// function's instances across nodes, which the simulator does not run, so a function's requests share its copies
// on every GPU of a node (MaxInFlight 0) as before; the data plane's evictions stay.
func clusterConcurrency(cfg *simulate.Config) {
	cfg.Autoscale, cfg.Instances, cfg.MaxInFlight = false, 1, 0
}

// productVariants are faas-gpu with the admission rule as shipped and as it would run with each part of the
// product's behaviour changed, down to the unlimited node the benchmark ran before instances.
func productVariants() []variant {
	fg := func(name string, shape func(cfg *simulate.Config)) variant {
		return variant{name: name, policy: controller.PolicyFaaSGPU, admission: true, shape: shape}
	}
	max4, err := autoscale.Parse(map[string]string{autoscale.LabelMax: "4"}, nil, simulate.DefaultMaxInstances)
	if err != nil {
		panic(err) // constant labels
	}
	return []variant{
		fg(refName, nil),
		fg("faas-gpu + admission, scale.max 4 (one instance per GPU)", func(cfg *simulate.Config) {
			cfg.Scaling = max4
		}),
		fg("faas-gpu + admission, model: shared (sibling copies over NVLink)", func(cfg *simulate.Config) {
			cfg.ModelShared = true
		}),
		fg("faas-gpu + admission, one instance (no scale label)", func(cfg *simulate.Config) {
			cfg.Autoscale, cfg.Instances = false, 1
		}),
		fg("faas-gpu + admission, data plane with every byte (not the product)", func(cfg *simulate.Config) {
			cfg.DataPlane = false
		}),
		fg("faas-gpu + admission, unlimited node (not the product: the figures before instances)",
			func(cfg *simulate.Config) {
				cfg.Autoscale, cfg.Instances, cfg.MaxInFlight, cfg.DataPlane = false, 1, 0, false
			}),
	}
}

// productChanges writes what the product's behaviour changed from the unlimited node, point by point of the
// product sweep: each variant's figures less the product's.
func productChanges(b *strings.Builder, rep report) {
	var sw *sweep
	for i := range rep.Sweeps {
		if rep.Sweeps[i].Name == "product" {
			sw = &rep.Sweeps[i]
		}
	}
	if sw == nil {
		return
	}
	w := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	w("## What the product's behaviour changed\n\n")
	w("Every sweep above runs what `up` and the gpuserver do (simulate.Product): one request bound per instance, "+
		"up's autoscaler over every function's instances (provider/autoscale's decision code; min 1, max %d, "+
		"target 1 request in flight per instance, proportion 1.0, 40 s scale-down window, an instance serving %s "+
		"after it is asked for, measured on `up` by TestAutoscalingThroughUp), each instance a controller entry "+
		"with copies of its own (the controller never evicts one instance's copy to place a sibling's), and the "+
		"data plane's own evictions (the executors hold 0.9 of each GPU's memory left after the gpuserver's "+
		"context; the controller plans with that capacity, each copy in whole 2 MiB chunks, so the data plane "+
		"evicts on its own only where a plan still does not fit: a swap-in out of chunks evicts the least "+
		"recently used idle copy, counted as faas_gpu_evictions_total{by=\"pressure\"}). "+
		"The benchmark ran before on a node without these: every request of a function could be bound at once on "+
		"every GPU, and the data plane had every byte the controller planned with. Means over the seeds, the "+
		"product's figure first, then each variant's difference from it (functions within SLO / requests within "+
		"SLO / refused / GPU busy), and the data plane's pressure evictions and the instances on average:\n\n",
		simulate.DefaultMaxInstances, simulate.DefaultInstanceStart)
	w("| x | variant | functions within SLO | requests within SLO | refused | GPU busy | pressure evictions | instances (mean) |\n")
	w("|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, pt := range sw.Points {
		ref, ok := find(pt, refName)
		if !ok {
			continue
		}
		m := func(c cell, f func(outcome) float64) float64 { return over(c.Runs, f).mean }
		busy := func(o outcome) float64 { return o.Busy }
		press := func(o outcome) float64 { return float64(o.Pressure) }
		inst := func(c cell) string {
			if v := m(c, func(o outcome) float64 { return o.Instances }); v > 0 {
				return fmt.Sprintf("%.1f", v)
			}
			return "static"
		}
		for _, c := range pt.Cells {
			if c.Policy == refName {
				w("| %s | **as shipped** | %.3f | %.3f | %.0f | %.2f | %.0f | %s |\n", pt.Label, m(c, fnShare),
					m(c, reqShare), m(c, refused), m(c, busy), m(c, press), inst(c))
				continue
			}
			w("| %s | %s | %+.3f | %+.3f | %+.0f | %+.2f | %.0f | %s |\n", pt.Label,
				strings.TrimPrefix(c.Policy, "faas-gpu + admission, "), m(c, fnShare)-m(ref, fnShare),
				m(c, reqShare)-m(ref, reqShare), m(c, refused)-m(ref, refused), m(c, busy)-m(ref, busy),
				m(c, press), inst(c))
		}
	}
	w("\nWhy: a function's requests run at once only on as many instances as it has, and each instance has a " +
		"copy of its own, so a hot function's instances fill the GPUs' memory with copies of one model (up to " +
		"scale.max of them) and push other functions' copies out, and every instance the autoscaler starts " +
		"serves only after its start and swaps its copy in with its first request (`model: shared` makes that " +
		"copy come over NVLink from a sibling's). The unlimited node, one copy per function bound by every " +
		"request at once, pays none of this; it is not the product. With one instance per function (no scale " +
		"label) a hot function is served one request at a time and its other requests wait or are refused.\n\n")
}
