package main

import (
	"context"
	"fmt"
	"log/slog"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/nvml"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/server"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

const policyUsage = "pool policy: faas-gpu (SLO-aware, default), torpor, fifo, gshare-dqls, ... or fcfs"

// parseOverload checks -overload.
func parseOverload(s string) (controller.Overload, error) {
	o, err := controller.ParseOverload(s)
	if err != nil {
		return o, usageError{fmt.Errorf("-overload: %w", err)}
	}
	return o, nil
}

// overloadUsage documents the -overload flag of up, gpuserver and sim.
const overloadUsage = "overload control of the faas-gpu policy: auto (shed the costliest functions only while the " +
	"node model says it raises the requests served on time), off, or a target share of GPU time such as 0.85 " +
	"(shed whenever the demand exceeds it)"

// admissionUsage documents the -admission flag of up, gpuserver and sim.
const admissionUsage = "admission rule for every policy: deadline (refuse with 429 and Retry-After a request " +
	"predicted to finish after its deadline, drop a queued one once it no longer can make it) or none"

// parseAdmission checks -admission.
func parseAdmission(s string) (controller.Admission, error) {
	a, err := controller.ParseAdmission(s)
	if err != nil {
		return a, usageError{fmt.Errorf("-admission: %w", err)}
	}
	return a, nil
}

// checkPolicy validates the --policy flag.
func checkPolicy(name string) error {
	if name == server.PolicyFCFS {
		return nil
	}
	if _, err := controller.ParsePolicy(name); err != nil {
		return usageError{fmt.Errorf("-policy: %w (or %s)", err, server.PolicyFCFS)}
	}
	return nil
}

// simKernelsUsage documents --sim-kernels (gpuserver and up).
const simKernelsUsage = "what simulated GPUs do with a kernel they cannot compute: reference (refuse its launch) " +
	"or dry (accept it without executing it: a protocol-test mode whose results are wrong)"

// simTimeScaleUsage documents --sim-time-scale (up).
const simTimeScaleUsage = "simulated GPUs only: run them timed, every kernel, copy and swap taking its modelled " +
	"time times this on the wall clock (1: real time; the GPU time of a busy kernel is its argument), as " +
	"`faas-gpu replay` does; 0 runs them without delays"

// parseSimKernels reads --sim-kernels.
func parseSimKernels(v string) (sim.KernelMode, error) {
	mode, err := sim.ParseKernelMode(v)
	if err != nil {
		return 0, usageError{fmt.Errorf("-sim-kernels %q: want reference or dry", v)}
	}
	return mode, nil
}

// checkSimKernels refuses dry mode on real GPUs (it concerns the simulator only); it closes the device then.
func checkSimKernels(mode sim.KernelMode, setup gpuSetup) error {
	if mode == sim.KernelsReference || setup.Device == nil {
		return nil
	}
	_ = setup.Device.Close(context.Background())
	return usageError{fmt.Errorf("-sim-kernels %s: the node's GPUs are real (%s backend); dry concerns simulated "+
		"GPUs only (choose one with -gpus, e.g. -gpus h100x8)", mode, setup.Device.Kind())}
}

// autoNode is the --gpus value that discovers the machine's GPUs and falls back to a simulated node: one whose
// GPUs the pinned CUDA 13 stack supports (PyTorch's cu130 wheels and CUDA 13's libraries have no code for the
// V100's compute capability 7.0, so every PyTorch function failed on a simulated v100x4 node).
const (
	autoNode     = "auto"
	fallbackNode = "h100x8"
)

// gpuSetup is what the --gpus and --gpu-memory flags resolve to: the node the controller places onto and, when
// real GPUs were found, the cuda backend (the gpuserver closes it); a nil Device means a simulated node.
type gpuSetup struct {
	Node    topology.Node
	Device  device.Backend
	Reserve uint64 // device memory reserved per GPU (0: the server's default)
}

// discoverFunc finds the machine's GPUs: their topology from NVML and the cuda backend. Tests replace it.
type discoverFunc func() (topology.Node, device.Backend, error)

// discoverGPUs discovers NVIDIA GPUs with NVML (nothing else is called after a failed Init) and opens the CUDA
// driver for them.
func discoverGPUs() (topology.Node, device.Backend, error) {
	node, err := nvml.Discover(gonvml.New(), "local")
	if err != nil {
		return topology.Node{}, nil, err
	}
	dev, err := cuda.Open("")
	if err != nil {
		return topology.Node{}, nil, fmt.Errorf("NVML found %d GPUs: %w", len(node.GPUs), err)
	}
	return node, dev, nil
}

// resolveGPUs turns the --gpus and --gpu-memory flags into a gpuSetup: "auto" discovers NVIDIA GPUs (and opens
// the cuda backend), else serves the simulated fallbackNode with a warning; a preset name or a node file is a
// simulated node. --gpu-memory overrides every GPU's memory (and caps what a real GPU reserves).
func resolveGPUs(log *slog.Logger, gpus, gpuMemory string, discover discoverFunc) (gpuSetup, error) {
	var setup gpuSetup
	var size uint64
	if gpuMemory != "" {
		var err error
		if size, err = topology.ParseSize(gpuMemory); err != nil {
			return gpuSetup{}, usageError{fmt.Errorf("-gpu-memory: %w", err)}
		}
	}
	if gpus == autoNode {
		node, dev, err := discover()
		if err == nil {
			setup.Node, setup.Device = node, dev
			log.Info("discovered NVIDIA GPUs: serving them through the cuda backend", "gpus", len(node.GPUs),
				"topology", node.Describe())
		} else {
			log.Warn("no NVIDIA GPU discovered: serving a simulated node", "gpu", fallbackNode, "err", err)
			gpus = fallbackNode
		}
	}
	if setup.Device == nil {
		node, err := topology.Resolve(gpus)
		if err != nil {
			return gpuSetup{}, usageError{fmt.Errorf("-gpus: %w", err)}
		}
		setup.Node = node
	}
	if size == 0 {
		return setup, nil
	}
	node, err := setup.Node.WithGPUMemory(size)
	if err != nil {
		if setup.Device != nil {
			_ = setup.Device.Close(context.Background())
		}
		return gpuSetup{}, usageError{fmt.Errorf("-gpu-memory: %w", err)}
	}
	setup.Node = node
	if setup.Device != nil {
		setup.Reserve = size
	}
	return setup, nil
}
