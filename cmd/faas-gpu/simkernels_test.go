package main

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestSimKernelsFlag: --sim-kernels takes reference or dry (a bad value is a usage error naming the flag), and dry
// is refused when the node's GPUs are real.
func TestSimKernelsFlag(t *testing.T) {
	var ue usageError
	if _, err := parseSimKernels("wet"); !errors.As(err, &ue) || !strings.Contains(err.Error(), "-sim-kernels") {
		t.Fatalf("bad value: %v", err)
	}
	for v, want := range map[string]sim.KernelMode{"reference": sim.KernelsReference, "dry": sim.KernelsDry} {
		if got, err := parseSimKernels(v); err != nil || got != want {
			t.Errorf("%s: %v %v", v, got, err)
		}
	}
	if err := checkSimKernels(sim.KernelsDry, gpuSetup{}); err != nil {
		t.Errorf("dry on a simulated node: %v", err)
	}
	node, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := sim.New(sim.Options{Node: node}) // stands in for the cuda backend
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSimKernels(sim.KernelsDry, gpuSetup{Node: node, Device: dev}); !errors.As(err, &ue) ||
		!strings.Contains(err.Error(), "-sim-kernels") {
		t.Errorf("dry on real GPUs: %v", err)
	}
	if err := checkSimKernels(sim.KernelsReference, gpuSetup{Node: node, Device: dev}); err != nil {
		t.Errorf("reference on real GPUs: %v", err)
	}
	var upCfg upConfig
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	upCfg.register(fs)
	if err := fs.Parse([]string{"-sim-kernels", "maybe"}); err != nil {
		t.Fatal(err)
	}
	if err := upCfg.validate(); !errors.As(err, &ue) || !strings.Contains(err.Error(), "-sim-kernels") {
		t.Errorf("up with a bad -sim-kernels: %v", err)
	}
}

// TestPoolShowsDryMode: `faas-gpu pool` says when the simulated GPUs run kernels dry.
func TestPoolShowsDryMode(t *testing.T) {
	var out bytes.Buffer
	printPool(&out, pool.Status{Policy: "faas-gpu", SimKernels: "dry", SimDryLaunches: 12})
	if !strings.Contains(out.String(), "DRY KERNEL MODE") || !strings.Contains(out.String(), "12 launches") {
		t.Errorf("dry:\n%s", out.String())
	}
	out.Reset()
	printPool(&out, pool.Status{Policy: "faas-gpu", SimKernels: "reference"})
	if strings.Contains(out.String(), "DRY") || !strings.Contains(out.String(), "kernels reference") {
		t.Errorf("reference:\n%s", out.String())
	}
	out.Reset()
	printPool(&out, pool.Status{Policy: "faas-gpu"})
	if strings.Contains(out.String(), "simulated") {
		t.Errorf("real GPUs:\n%s", out.String())
	}
}
