package server

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// sharingEnabler is a device whose physical memory must be created shareable before it can be lent to another
// process (the cuda backend: cuMemCreate with a POSIX file descriptor handle type).
type sharingEnabler interface{ EnableSharing() error }

// startTenants builds the data plane of executor processes per tenant (docs/tenants.md): the gpuserver creates
// every GPU's chunks on its own device and lends them; each tenant's executor opens the same node, its own
// repository directory under RepositoryDir, and runs its functions' sessions.
func (s *Server) startTenants(dev device.Backend, reserve uint64) error {
	tc := s.cfg.Tenants
	if len(tc.Command) == 0 {
		return fmt.Errorf("gpuserver: tenant executors: no command to start them")
	}
	var exec handoff.Device
	switch d := dev.(type) {
	case *sim.Backend:
		exec = handoff.Device{Kind: "sim", Sim: &handoff.SimDevice{Node: d.Node(), Kernels: d.KernelMode().String(),
			ProcessWide: s.cfg.SimProcessWide || d.ProcessWide(), Granularity: d.GPUs()[0].Granularity,
			TimeScale: d.TimeScale()}}
	default:
		exec = handoff.Device{Kind: dev.Kind()}
		if e, ok := dev.(sharingEnabler); ok {
			if err := e.EnableSharing(); err != nil {
				return fmt.Errorf("gpuserver: tenant executors: %w", err)
			}
		}
		if reserve == 0 { // leave every executor's contexts room on each GPU
			maxTenants, ctxBytes := tc.MaxTenants, tc.ContextBytes
			if maxTenants <= 0 {
				maxTenants = tenant.DefaultMaxTenants
			}
			if ctxBytes == 0 {
				ctxBytes = DefaultTenantContextBytes
			}
			leave := uint64(maxTenants) * ctxBytes
			for _, g := range dev.GPUs() {
				free, _, err := dev.MemoryInfo(g.Index)
				if err != nil {
					return fmt.Errorf("gpuserver: gpu %d: %w", g.Index, err)
				}
				if free <= leave {
					return fmt.Errorf("gpuserver: gpu %d has %d bytes free, less than %d tenants' contexts of %d bytes "+
						"(--max-tenants, --tenant-context-bytes)", g.Index, free, maxTenants, ctxBytes)
				}
				if r := uint64(float64(free-leave) * memory.DefaultShare); reserve == 0 || r < reserve {
					reserve = r
				}
			}
		}
	}
	if _, ok := dev.(device.Sharer); !ok {
		return fmt.Errorf("gpuserver: tenant executors: the %s backend cannot lend memory to other processes", dev.Kind())
	}
	mem, err := memory.New(dev, memory.Config{MaxBytesPerGPU: reserve})
	if err != nil {
		return fmt.Errorf("gpuserver: device memory: %w", err)
	}
	s.closers = append(s.closers, mem.Close)
	s.capacity, s.chunks = chunkCapacity(mem), mem
	dir := s.cfg.RepositoryDir
	if dir == "" {
		dir = filepath.Join(filepath.Dir(s.cfg.KeyFile), "repository")
	}
	pl, err := tenant.New(tenant.Config{Device: dev, Memory: mem, Executor: exec, RepositoryDir: dir,
		Command: tc.Command, Env: tc.Env, Stderr: tc.Stderr, MaxTenants: tc.MaxTenants, LogLevel: tc.LogLevel,
		Logger: s.cfg.Logger.With("component", "tenants"), Metrics: s.metrics, BackoffMin: tc.BackoffMin,
		BackoffMax: tc.BackoffMax, MaxModuleBytes: tc.MaxModuleBytes, OnFault: s.faults.fault,
		OnEvict: s.evicted.report})
	if err != nil {
		return fmt.Errorf("gpuserver: %w", err)
	}
	s.tenants = pl
	s.closers = append(s.closers, func(ctx context.Context) error { return pl.Close(ctx) })
	s.cfg.Logger.Info("gpuserver data plane: an executor process per tenant", "device", dev.Kind(),
		"gpus", len(dev.GPUs()), "repository", dir, "reserve_bytes_per_gpu", reserve,
		"max_tenants", tc.MaxTenants)
	return nil
}
