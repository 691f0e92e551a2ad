package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/simulate"
	"github.com/faas-gpu/faas-gpu/provider/autoscale"
)

// simProductFlags are `faas-gpu sim`'s flags for what `up` and the gpuserver do around the controller: instances
// and the autoscaler (package provider/autoscale, the same decision code), and the data plane's own evictions.
// Their defaults are the product's.
type simProductFlags struct {
	autoscale   bool
	labels      string
	window      time.Duration
	interval    time.Duration
	start       time.Duration
	modelShared bool
	dataPlane   bool
}

// defaultScaleLabels are the labels every simulated function is deployed with: autoscaled up to the local
// backend's most replicas.
var defaultScaleLabels = fmt.Sprintf("%s=%d", autoscale.LabelMax, simulate.DefaultMaxInstances)

func (f *simProductFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.autoscale, "autoscale-instances", true, "run up's autoscaler over every function's instances "+
		"(provider/autoscale's decision code, one request in flight per instance, on one node); false keeps "+
		"--instances static")
	fs.StringVar(&f.labels, "scale-labels", defaultScaleLabels, "every function's com.openfaas.scale.* labels, "+
		"comma-separated (min, max, target, target-proportion, zero; checked as a deploy checks them)")
	fs.DurationVar(&f.window, "scale-down-window", autoscale.DefaultScaleDownWindow,
		"up's -scale-down-window: a function scales down only to the most instances it wanted over this window "+
			"(0: at once)")
	fs.DurationVar(&f.interval, "autoscale-interval", autoscale.DefaultInterval, "up's -autoscale-interval")
	fs.DurationVar(&f.start, "instance-start", simulate.DefaultInstanceStart, "how long a new instance takes to "+
		"serve (default measured on up by TestAutoscalingThroughUp: all 8 replicas ready 1.5-3.2 s after the load "+
		"started, a CPU function on a 2-core VM; a GPU function's framework import and model load come on top)")
	fs.BoolVar(&f.modelShared, "model-shared", false, "deploy every function with com.openfaas.gpu.model: shared, "+
		"so that a sibling instance's copy is a swap source over NVLink")
	fs.BoolVar(&f.dataPlane, "dataplane", true, "model the executors' memory (0.9 of each GPU's free memory, in "+
		"chunks; the controller plans with it, as the gpuserver gives it) and their own evictions under pressure; "+
		"false gives the controller and the data plane each GPU's whole memory, which the product does NOT give them")
}

// apply sets cfg's instances, autoscaler and data plane from the flags; instances is --instances (0: the
// autoscaler's, 1 without it); cluster runs keep static instances (in a cluster the OpenFaaS or Knative
// autoscaler scales them, not up's).
func (f *simProductFlags) apply(cfg *simulate.Config, instances int, cluster bool) error {
	flagErr := func(name string, err error) error { return usageError{fmt.Errorf("-%s: %w", name, err)} }
	cfg.DataPlane, cfg.ModelShared = f.dataPlane, f.modelShared
	if !f.autoscale || cluster || instances > 0 {
		cfg.Instances = max(1, instances)
		return nil
	}
	labels := map[string]string{}
	for _, kv := range strings.Split(f.labels, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return flagErr("scale-labels", fmt.Errorf("%q: want label=value", kv))
		}
		if !strings.HasPrefix(k, "com.openfaas.scale.") {
			k = "com.openfaas.scale." + k
		}
		labels[k] = v
	}
	p, err := autoscale.Parse(labels, nil, simulate.DefaultMaxInstances)
	if err != nil {
		return flagErr("scale-labels", err)
	}
	if !p.Autoscaled {
		return flagErr("scale-labels", errors.New("no label asks for autoscaling (give max, target, "+
			"target-proportion or zero), or --autoscale-instances=false"))
	}
	if f.interval <= 0 || f.window < 0 {
		return flagErr("autoscale-interval", errors.New("the interval must be positive, the window not negative"))
	}
	window, start := f.window, f.start
	if window == 0 {
		window = -1 // simulate.Config: negative is at once, 0 the default
	}
	if start == 0 {
		start = -1
	}
	cfg.Autoscale, cfg.Scaling, cfg.ScaleDownWindow, cfg.AutoscaleInterval, cfg.InstanceStart = true, p, window,
		f.interval, start
	cfg.Instances = 0
	return nil
}
