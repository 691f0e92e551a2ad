package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/faas-gpu/faas-gpu/provider/autoscale"
)

// autoscaleFlags are the local backend's autoscaler flags (package provider/autoscale), shared by `up` and
// `provider -backend local`.
type autoscaleFlags struct {
	enabled  bool
	interval time.Duration
	window   time.Duration
}

func (a *autoscaleFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&a.enabled, "autoscale", true,
		"scale the functions whose com.openfaas.scale.* labels ask for it (max, target, target-proportion, type, "+
			"zero) by their requests in flight, between scale.min and scale.max (local backend)")
	fs.DurationVar(&a.interval, "autoscale-interval", autoscale.DefaultInterval,
		"how often the autoscaler looks at the functions' requests in flight")
	fs.DurationVar(&a.window, "scale-down-window", autoscale.DefaultScaleDownWindow,
		"a function scales down only to the most replicas it wanted over this window (0: at once); scale-up is "+
			"immediate")
}

func (a *autoscaleFlags) validate() error {
	switch {
	case a.interval <= 0:
		return usageError{fmt.Errorf("-autoscale-interval %s: must be positive", a.interval)}
	case a.window < 0:
		return usageError{fmt.Errorf("-scale-down-window %s: must not be negative", a.window)}
	}
	return nil
}

// config is the local backend's autoscaler configuration, nil with -autoscale=false.
func (a *autoscaleFlags) config(m *autoscale.Metrics) *autoscale.Config {
	if !a.enabled {
		return nil
	}
	window := a.window
	if window == 0 {
		window = -1 // autoscale.Config: negative is at once, 0 the default
	}
	return &autoscale.Config{Interval: a.interval, ScaleDownWindow: window, Metrics: m}
}
