package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// Source says where a swap reads a model from.
type Source struct {
	// GPU is topology.Host for host memory, else the GPU holding the copy.
	GPU int
	// Kind is SwapPCIe, SwapNVLink or SwapCold.
	Kind string
	// Bytes of the model image.
	Bytes uint64
}

// Actuator carries out the data movement the controller decides; the data plane's executors implement it.
type Actuator interface {
	// SwapIn makes function's model usable on gpu, reading from from; it returns once requests may run (a
	// pipelined executor returns once the swap has started). It honours ctx.
	SwapIn(ctx context.Context, function string, gpu int, from Source) error
	// Evict drops function's copy on gpu (the host copy is authoritative; nothing is written back).
	Evict(ctx context.Context, function string, gpu int) error
}

// LinkActuator is the Actuator used when no data plane is wired: it moves no data, and SwapIn takes the time the
// topology's link model gives for the transfer under the transfers it is running concurrently.
type LinkActuator struct {
	node topology.Node

	mu     sync.Mutex
	active []topology.Path
}

// NewLinkActuator returns a LinkActuator for node.
func NewLinkActuator(node topology.Node) *LinkActuator { return &LinkActuator{node: node.Clone()} }

// SwapIn waits for the modelled transfer time or until ctx ends.
func (a *LinkActuator) SwapIn(ctx context.Context, function string, gpu int, from Source) error {
	if gpu < 0 || gpu >= len(a.node.GPUs) {
		return fmt.Errorf("swap in %q: no GPU %d", function, gpu)
	}
	p := topology.Path{From: from.GPU, To: gpu}
	a.mu.Lock()
	a.active = append(a.active, p)
	d := a.node.TransferTime(from.Bytes, p, a.active)
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		for i, q := range a.active {
			if q == p {
				a.active = append(a.active[:i], a.active[i+1:]...)
				break
			}
		}
		a.mu.Unlock()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("swap in %q on GPU %d: %w", function, gpu, ctx.Err())
	}
}

// Evict does nothing: there is no data to drop.
func (a *LinkActuator) Evict(context.Context, string, int) error { return nil }
