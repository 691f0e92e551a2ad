package tenant

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// GPU health and a tenant's faults (docs/security.md, "A function's faults never take a GPU out").
//
// A kernel fault of a tenant is the tenant's, never the GPU's: the executor reports it (KindFault) and ends, its
// contexts with it (on a real GPU one illegal address poisons every context of its process), and the GPU stays in
// service for every other tenant. Once the executor ended, the gpuserver checks the GPU (device.CheckHealth: a
// fresh context in the gpuserver's own process, where no tenant's kernel ever ran, sets memory and reads it back):
// only a GPU that fails the check is taken out of service (MarkUnhealthy), as a device failure.
//
// An executor reports a GPU failed (KindGPUFailed) when the device's own work fails there (a context fault never
// is such a report: executor.Node keeps the GPU in service). A report made after the executor's tenant faulted
// (AfterFault, or a KindFault of the same executor before it) may be its poisoned contexts speaking, not the GPU:
// it is not trusted; the GPU is checked when the executor ended, as after a fault. Any other report is a device
// failure and takes the GPU out of service at once.

// healthCheckTimeout bounds one GPU health check.
const healthCheckTimeout = 30 * time.Second

// tenantFaulted handles a kernel fault of g's tenant (KindFault).
func (pl *Plane) tenantFaulted(g *generation, e handoff.Fault) {
	pl.mu.Lock()
	if e.GPU >= 0 && e.GPU < len(pl.faults) {
		pl.faults[e.GPU]++
	}
	pl.mu.Unlock()
	g.p.mu.Lock()
	g.p.faults++
	g.p.mu.Unlock()
	g.mu.Lock()
	g.faulted = true
	g.mu.Unlock()
	pl.metrics.faults.WithLabelValues(g.p.tenant).Inc()
	pl.log.Warn("a kernel of a tenant faulted: its executor ends and is restarted; other tenants are not "+
		"affected, the gpu stays in service and is checked once the executor ended", "tenant", g.p.tenant,
		"gpu", e.GPU, "function", e.Function, "err", e.Error)
	if e.Function != "" && pl.cfg.OnFault != nil {
		pl.cfg.OnFault(e.Function, e.GPU, e.Error)
	}
	if e.GPU >= 0 && e.GPU < pl.GPUs() {
		pl.checkAfter(g, e.GPU, "a kernel fault of "+g.p.tenant)
	}
}

// gpuFailed handles an executor's report that a GPU failed under it (KindGPUFailed).
func (pl *Plane) gpuFailed(g *generation, e handoff.GPUFailed) {
	g.mu.Lock()
	afterFault := e.AfterFault || g.faulted
	g.mu.Unlock()
	if afterFault {
		pl.log.Warn("an executor whose tenant faulted reported a gpu failed: not trusted (its contexts were "+
			"poisoned); the gpu stays in service and is checked once the executor ended", "tenant", g.p.tenant,
			"gpu", e.GPU, "err", e.Error)
		pl.checkAfter(g, e.GPU, "a failure reported by the executor of "+g.p.tenant+" after its fault")
		return
	}
	pl.log.Error("an executor took a gpu out of service", "tenant", g.p.tenant, "gpu", e.GPU, "err", e.Error)
	pl.MarkUnhealthy(e.GPU, fmt.Errorf("the executor of %s saw it fail: %s", g.p.tenant, e.Error))
}

// checkAfter checks gpu once generation g ended (once per GPU and generation): a GPU that fails the check is taken
// out of service.
func (pl *Plane) checkAfter(g *generation, gpu int, why string) {
	g.mu.Lock()
	if g.checks == nil {
		g.checks = map[int]bool{}
	}
	first := !g.checks[gpu]
	g.checks[gpu] = true
	g.mu.Unlock()
	if !first {
		return
	}
	pl.bg.Add(1)
	go func() {
		defer pl.bg.Done()
		select {
		case <-g.gone:
		case <-pl.ctx.Done():
			return
		}
		pl.mu.Lock()
		closed := pl.closed
		pl.mu.Unlock()
		if closed {
			return
		}
		ctx, cancel := context.WithTimeout(pl.ctx, healthCheckTimeout)
		defer cancel()
		started := time.Now()
		err := pl.checkGPU(ctx, gpu)
		took := time.Since(started)
		if errors.Is(err, context.Canceled) && pl.ctx.Err() != nil {
			return // the gpuserver shuts down
		}
		if err != nil {
			pl.metrics.checks.WithLabelValues(fmt.Sprint(gpu), "failed").Inc()
			pl.log.Error("gpu failed its health check after "+why+": out of service", "gpu", gpu,
				"tenant", g.p.tenant, "took", took.Round(time.Microsecond), "err", err)
			pl.MarkUnhealthy(gpu, fmt.Errorf("the health check after %s failed: %w", why, err))
			return
		}
		pl.metrics.checks.WithLabelValues(fmt.Sprint(gpu), "passed").Inc()
		pl.log.Info("gpu passed its health check after "+why+": in service", "gpu", gpu, "tenant", g.p.tenant,
			"took", took.Round(time.Microsecond))
	}()
}

// checkGPU runs the GPU health check (Config.CheckGPU, else device.CheckHealth on the gpuserver's device).
func (pl *Plane) checkGPU(ctx context.Context, gpu int) error {
	if pl.cfg.CheckGPU != nil {
		return pl.cfg.CheckGPU(ctx, gpu)
	}
	return device.CheckHealth(ctx, pl.cfg.Device, gpu)
}
