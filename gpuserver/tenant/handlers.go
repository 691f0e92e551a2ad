package tenant

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// handlers answer what one executor generation asks of the gpuserver (handoff.Ops, handoff.ToGPUServer).
func (pl *Plane) handlers(g *generation) map[handoff.Kind]handoff.Handler {
	e := fromExecutor{pl: pl, g: g}
	return handoff.Routes(handoff.ToGPUServer,
		handoff.OpBorrow.HandleFiles(e.borrow),
		handoff.OpReturn.Handle(e.giveBack),
		handoff.OpReserveImages.Handle(e.reserveImages),
		handoff.OpReleaseImages.Handle(e.releaseImages),
		handoff.OpBindImplicit.Handle(e.bindImplicit),
		handoff.OpReleaseImplicit.Handle(e.releaseImplicit),
		handoff.EventSessionEnded.Handle(e.sessionEnded),
		handoff.EventGPUFailed.Handle(e.gpuFailed),
		handoff.EventEvicted.Handle(e.evicted),
		handoff.EventFault.Handle(e.fault),
	)
}

// fromExecutor answers the requests of one executor generation.
type fromExecutor struct {
	pl *Plane
	g  *generation
}

func (e fromExecutor) borrow(ctx context.Context, b handoff.Borrow, _ []*os.File) (handoff.Lent, []*os.File, error) {
	pl, g := e.pl, e.g
	lent, files, err := pl.lend.borrow(ctx, g, b.GPU, b.N, pl.generations)
	if err != nil {
		return handoff.Lent{}, nil, err
	}
	if g.live() == nil { // it ended meanwhile: the chunks stay home
		for _, f := range files {
			_ = f.Close()
		}
		_ = pl.lend.giveBack(g, b.GPU, lent.Indexes)
		return handoff.Lent{}, nil, fmt.Errorf("%w: the executor ended", handoff.ErrClosed)
	}
	return lent, files, nil
}

func (e fromExecutor) giveBack(_ context.Context, r handoff.Return) (handoff.None, error) {
	return handoff.None{}, e.pl.lend.giveBack(e.g, r.GPU, r.Indexes)
}

func (e fromExecutor) reserveImages(_ context.Context, b handoff.ImageBytes) (handoff.None, error) {
	return handoff.None{}, e.pl.reserveImages(e.g, b.Bytes)
}

func (e fromExecutor) releaseImages(_ context.Context, b handoff.ImageBytes) (handoff.None, error) {
	e.pl.releaseImages(e.g, b.Bytes, false)
	return handoff.None{}, nil
}

func (e fromExecutor) bindImplicit(ctx context.Context, n handoff.Name) (handoff.Bound, error) {
	pl, g := e.pl, e.g
	if t, err := pl.tenantOf(n.Function); err != nil || t != g.p.tenant {
		return handoff.Bound{}, fmt.Errorf("%w: %s is not a function of %s", executor.ErrUnknownFunction, n.Function,
			g.p.tenant)
	}
	box := pl.binder.Load()
	if box == nil {
		return handoff.Bound{}, fmt.Errorf("%w: no pool to bind %s", ErrExecutorDown, n.Function)
	}
	gpu, release, err := box.b.BindImplicit(ctx, n.Function)
	if err != nil {
		return handoff.Bound{}, err
	}
	pl.mu.Lock()
	pl.nextID++
	id := fmt.Sprintf("implicit-%d", pl.nextID)
	pl.mu.Unlock()
	g.mu.Lock()
	if g.ended {
		g.mu.Unlock()
		release()
		return handoff.Bound{}, fmt.Errorf("%w: the executor ended", handoff.ErrClosed)
	}
	g.implicit[id] = release
	g.mu.Unlock()
	return handoff.Bound{GPU: gpu, Binding: id}, nil
}

func (e fromExecutor) releaseImplicit(_ context.Context, r handoff.Release) (handoff.None, error) {
	g := e.g
	g.mu.Lock()
	release := g.implicit[r.Binding]
	delete(g.implicit, r.Binding)
	g.mu.Unlock()
	if release == nil {
		return handoff.None{}, fmt.Errorf("%w: implicit binding %s", handoff.ErrProtocol, r.Binding)
	}
	release()
	return handoff.None{}, nil
}

func (e fromExecutor) sessionEnded(_ context.Context, s handoff.SessionEnded) error {
	e.g.sessionEnded(s.ID)
	return nil
}

func (e fromExecutor) gpuFailed(_ context.Context, f handoff.GPUFailed) error {
	if f.GPU < 0 || f.GPU >= e.pl.GPUs() {
		return fmt.Errorf("%w: gpu %d", handoff.ErrProtocol, f.GPU)
	}
	e.pl.gpuFailed(e.g, f)
	return nil
}

// evicted is a copy the executor dropped on its own (executor.Config.OnEvict), told to Config.OnEvict.
func (e fromExecutor) evicted(_ context.Context, ev handoff.Evicted) error {
	pl, g := e.pl, e.g
	if ev.GPU < 0 || ev.GPU >= pl.GPUs() {
		return fmt.Errorf("%w: gpu %d", handoff.ErrProtocol, ev.GPU)
	}
	if t, err := pl.tenantOf(ev.Function); err != nil || t != g.p.tenant {
		return fmt.Errorf("%w: the executor of %s reported an eviction of %q, not its tenant's",
			handoff.ErrProtocol, g.p.tenant, ev.Function)
	}
	if ev.Reason != executor.EvictPressure && ev.Reason != executor.EvictReclaim {
		return fmt.Errorf("%w: eviction reason %q", handoff.ErrProtocol, ev.Reason)
	}
	if pl.cfg.OnEvict != nil {
		pl.cfg.OnEvict(ev.GPU, ev.Function, ev.Reason)
	}
	return nil
}

func (e fromExecutor) fault(_ context.Context, f handoff.Fault) error {
	e.pl.tenantFaulted(e.g, f)
	return nil
}

func (pl *Plane) tenantOf(function string) (string, error) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	t, ok := pl.fns[function]
	if !ok {
		return "", fmt.Errorf("%w: %s", executor.ErrUnknownFunction, function)
	}
	return t, nil
}

// generations lists the running executors.
func (pl *Plane) generations() []*generation {
	pl.mu.Lock()
	procs := pl.procList()
	pl.mu.Unlock()
	var out []*generation
	for _, p := range procs {
		if g := p.current(); g != nil && g.live() != nil {
			out = append(out, g)
		}
	}
	return out
}

// Status merges the executors' views of every GPU: resident and active functions, swaps, faults; free memory is
// the gpuserver's free chunks plus the chunks executors hold free.
func (pl *Plane) Status() []executor.Status {
	cs := pl.mem.ChunkSize()
	out := make([]executor.Status, pl.GPUs())
	pl.mu.Lock()
	for g := range out {
		out[g] = executor.Status{GPU: g, Healthy: pl.unhealthy[g] == nil, GroupBytes: pl.cfg.GroupBytes,
			FreeBytes: uint64(pl.mem.Pool(g).Free()) * cs, TotalBytes: uint64(pl.mem.Pool(g).Total()) * cs,
			ContextFaults: pl.faults[g]}
		if err := pl.unhealthy[g]; err != nil {
			out[g].Error = err.Error()
		}
	}
	pl.mu.Unlock()
	for _, st := range pl.executorStatuses() {
		for _, e := range st.GPUs {
			if e.GPU < 0 || e.GPU >= len(out) {
				continue
			}
			o := &out[e.GPU]
			o.FreeBytes += e.FreeBytes
			o.Resident = append(o.Resident, e.Resident...)
			o.Active = append(o.Active, e.Active...)
			o.Swaps += e.Swaps
			o.SwapBytes += e.SwapBytes
			o.ScratchWrittenBack += e.ScratchWrittenBack
			o.ScratchRestored += e.ScratchRestored
			o.ContextFaults += e.ContextFaults
			if o.GroupBytes == 0 {
				o.GroupBytes = e.GroupBytes
			}
			if !e.Healthy && o.Healthy {
				o.Healthy, o.Error = false, e.Error
			}
		}
	}
	for i := range out {
		sort.Strings(out[i].Resident)
		sort.Strings(out[i].Active)
	}
	return out
}

// executorStatuses asks every running executor for its status (briefly: a busy one is left out).
func (pl *Plane) executorStatuses() []handoff.Status {
	var out []handoff.Status
	for _, g := range pl.generations() {
		peer := g.live()
		if peer == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(pl.ctx, 5*time.Second)
		st, err := handoff.OpStatus.Call(ctx, peer, handoff.None{})
		cancel()
		if err == nil {
			out = append(out, st)
		}
	}
	return out
}

// Tenants describes every tenant's executor.
func (pl *Plane) Tenants() []pool.TenantStatus {
	pl.mu.Lock()
	procs := pl.procList()
	pl.mu.Unlock()
	out := make([]pool.TenantStatus, 0, len(procs))
	for _, p := range procs {
		p.mu.Lock()
		ts := pool.TenantStatus{Tenant: p.tenant, State: p.state, Generation: p.gens, Restarts: p.restarts,
			Faults: p.faults, LastExit: p.lastExit, Functions: len(p.functions)}
		if p.cur != nil {
			ts.PID = p.cur.pid
		}
		p.mu.Unlock()
		out = append(out, ts)
	}
	return out
}

// Records sums the executors' remoting counters (records executed, sleeps), which their sessions count.
func (pl *Plane) Records() (records, sleeps int64) {
	for _, st := range pl.executorStatuses() {
		records += st.Records
		sleeps += st.Sleeps
	}
	return records, sleeps
}

// PID of a tenant's running executor (0 when none): tests kill it.
func (pl *Plane) PID(tenant string) int {
	pl.mu.Lock()
	p := pl.procs[tenant]
	pl.mu.Unlock()
	if p == nil {
		return 0
	}
	if g := p.current(); g != nil && g.live() != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		return g.pid
	}
	return 0
}

// metrics of the tenants' executors.
type metrics struct {
	up       *prometheus.GaugeVec
	restarts *prometheus.CounterVec
	faults   *prometheus.CounterVec
	checks   *prometheus.CounterVec
	sessions *sessionCollector
}

// sessionCollector exports the remoting counters the executors' sessions keep (records executed, sleeps on their
// sockets: faas_gpu_remoting_records_total and faas_gpu_remoting_sleeps_total count the gpuserver's own sessions
// only, none with executors), asked of every running executor at each scrape. A restarted executor counts from 0.
type sessionCollector struct {
	pl              *Plane
	records, sleeps *prometheus.Desc
}

func (c *sessionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.records; ch <- c.sleeps }

func (c *sessionCollector) Collect(ch chan<- prometheus.Metric) {
	if c.pl == nil {
		return
	}
	for _, g := range c.pl.generations() {
		peer := g.live()
		if peer == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(c.pl.ctx, 5*time.Second)
		st, err := handoff.OpStatus.Call(ctx, peer, handoff.None{})
		cancel()
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.records, prometheus.CounterValue, float64(st.Records), g.p.tenant)
		ch <- prometheus.MustNewConstMetric(c.sleeps, prometheus.CounterValue, float64(st.Sleeps), g.p.tenant)
	}
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faas_gpu_tenant_up",
			Help: "1 while the tenant's executor process serves, 0 while it is (re)starting or backed off."},
			[]string{"tenant"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faas_gpu_tenant_restarts_total",
			Help: "Tenant executor processes that ended and were restarted (a crash, a kill, a kernel fault)."},
			[]string{"tenant"}),
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faas_gpu_tenant_faults_total",
			Help: "Kernel faults of a tenant's functions: each ended that tenant's executor only."},
			[]string{"tenant"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faas_gpu_gpu_health_checks_total",
			Help: "GPU health checks after a tenant's kernel fault, by result (passed: the GPU stayed in service; " +
				"failed: it was taken out of service)."}, []string{"gpu", "result"}),
		sessions: &sessionCollector{
			records: prometheus.NewDesc("faas_gpu_tenant_remoting_records_total",
				"Call records the sessions of a tenant's executor executed (since that executor started).",
				[]string{"tenant"}, nil),
			sleeps: prometheus.NewDesc("faas_gpu_tenant_remoting_sleeps_total",
				"Times the sessions of a tenant's executor found their ring empty for their whole spin time and "+
					"slept on their socket (since that executor started).", []string{"tenant"}, nil),
		},
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.up, m.restarts, m.faults, m.checks, m.sessions} {
			if err := reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
				return nil, err
			}
		}
	}
	return m, nil
}
