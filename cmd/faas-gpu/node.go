package main

import (
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/controller"
	"github.com/faas-gpu/faas-gpu/gpuserver/server"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

const policyUsage = "pool policy: faas-gpu (SLO-aware, default), torpor, fifo, gshare-dqls, ... or fcfs"

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

// autoNode is the --gpus value that discovers the machine's GPUs and falls back to a simulated node.
const (
	autoNode     = "auto"
	fallbackNode = "v100x4"
)

// resolveNode turns the --gpus and --gpu-memory flags into a node description: a preset name or a node file,
// with every GPU's memory overridden when gpuMemory is set. "auto" uses the simulated v100x4 node when no NVIDIA
// GPU is discovered.
func resolveNode(gpus, gpuMemory string) (topology.Node, error) {
	if gpus == autoNode {
		gpus = fallbackNode
	}
	node, err := topology.Resolve(gpus)
	if err != nil {
		return topology.Node{}, usageError{fmt.Errorf("-gpus: %w", err)}
	}
	if gpuMemory == "" {
		return node, nil
	}
	size, err := topology.ParseSize(gpuMemory)
	if err != nil {
		return topology.Node{}, usageError{fmt.Errorf("-gpu-memory: %w", err)}
	}
	node, err = node.WithGPUMemory(size)
	if err != nil {
		return topology.Node{}, usageError{fmt.Errorf("-gpu-memory: %w", err)}
	}
	return node, nil
}
