package router

import (
	"cmp"
	"fmt"
	"time"
)

// Action is an autoscaling decision.
type Action int

// Autoscaling actions.
const (
	Hold Action = iota
	AddNode
	DrainNode
)

func (a Action) String() string { return [...]string{"hold", "add", "drain"}[a] }

// Defaults of AutoscaleConfig.
const (
	DefaultAutoscaleEvery = 30 * time.Second
	DefaultAttainment     = 0.99
	DefaultUpUtil         = 0.7
	DefaultDownUtil       = 0.45
	DefaultCooldown       = 2 * time.Minute
)

// AutoscaleConfig configures an Autoscaler; zero fields take the defaults.
type AutoscaleConfig struct {
	// Every is how often Decide looks at the last interval.
	Every time.Duration
	// Attainment: a node is added when fewer than this share of the interval's requests met their deadline
	// (refused ones count as missed).
	Attainment float64
	// UpUtil: a node is added when the GPU time requests held in the interval exceeds this share of the serving
	// nodes' GPU time.
	UpUtil float64
	// DownUtil: the least loaded node is drained when the requests' GPU time would take less than this share of
	// the GPU time of one node fewer, attainment was met and nothing was refused, and Cooldown has passed since
	// the last change.
	DownUtil float64
	// Cooldown after any change before a node is drained (adding is never held back by it).
	Cooldown time.Duration
	// MinNodes and MaxNodes bound the serving nodes (MinNodes at least 1; MaxNodes 0: no bound).
	MinNodes, MaxNodes int
}

// Autoscaler decides from the interval's outcomes whether to add a node or drain one.
type Autoscaler struct {
	cfg                AutoscaleConfig
	last, lastChange   time.Time
	served, onTime     int64
	refused            int64
	held               time.Duration
	adds, drains       int
	lastUtil, lastAttn float64
}

// NewAutoscaler returns an autoscaler.
func NewAutoscaler(cfg AutoscaleConfig) (*Autoscaler, error) {
	cfg.Every = cmp.Or(cfg.Every, DefaultAutoscaleEvery)
	cfg.Attainment = cmp.Or(cfg.Attainment, DefaultAttainment)
	cfg.UpUtil = cmp.Or(cfg.UpUtil, DefaultUpUtil)
	cfg.DownUtil = cmp.Or(cfg.DownUtil, DefaultDownUtil)
	cfg.Cooldown = cmp.Or(cfg.Cooldown, DefaultCooldown)
	cfg.MinNodes = max(1, cfg.MinNodes)
	switch {
	case cfg.Every < 0 || cfg.Cooldown < 0:
		return nil, fmt.Errorf("%w: autoscale interval and cooldown must be > 0", ErrInvalidConfig)
	case cfg.Attainment < 0 || cfg.Attainment > 1:
		return nil, fmt.Errorf("%w: attainment must be in [0, 1]", ErrInvalidConfig)
	case cfg.DownUtil < 0 || cfg.UpUtil <= cfg.DownUtil || cfg.UpUtil > 1:
		return nil, fmt.Errorf("%w: want 0 <= down utilisation < up utilisation <= 1", ErrInvalidConfig)
	case cfg.MaxNodes != 0 && cfg.MaxNodes < cfg.MinNodes:
		return nil, fmt.Errorf("%w: max nodes below min nodes", ErrInvalidConfig)
	}
	return &Autoscaler{cfg: cfg}, nil
}

// Every is the interval between decisions.
func (a *Autoscaler) Every() time.Duration { return a.cfg.Every }

// Observe records one finished request: whether it met its deadline and how long it held a GPU.
func (a *Autoscaler) Observe(onTime bool, held time.Duration) {
	a.served++
	if onTime {
		a.onTime++
	}
	a.held += held
}

// Refused records a request no node took (it counts as missed).
func (a *Autoscaler) Refused() { a.refused++ }

// Decide looks at the interval since the last decision with serving nodes of gpusPerNode GPUs each (pending:
// nodes added but not serving yet) and returns what to do; the caller adds a node, or drains the least loaded one.
func (a *Autoscaler) Decide(now time.Time, serving, pending, gpusPerNode int) Action {
	if a.last.IsZero() {
		a.last, a.lastChange = now, now
		return Hold
	}
	span := now.Sub(a.last)
	a.last = now
	total := a.served + a.refused
	attn := 1.0
	if total > 0 {
		attn = float64(a.onTime) / float64(total)
	}
	util := 0.0
	if serving > 0 && span > 0 {
		util = a.held.Seconds() / (span.Seconds() * float64(serving*gpusPerNode))
	}
	refused := a.refused
	a.lastUtil, a.lastAttn = util, attn
	a.served, a.onTime, a.refused, a.held = 0, 0, 0, 0
	nodes := serving + pending
	switch {
	case (attn < a.cfg.Attainment || util > a.cfg.UpUtil) && pending == 0 &&
		(a.cfg.MaxNodes == 0 || nodes < a.cfg.MaxNodes):
		a.lastChange = now
		a.adds++
		return AddNode
	case pending == 0 && serving > a.cfg.MinNodes && refused == 0 && attn >= a.cfg.Attainment &&
		now.Sub(a.lastChange) >= a.cfg.Cooldown &&
		util*float64(serving)/float64(serving-1) < a.cfg.DownUtil:
		a.lastChange = now
		a.drains++
		return DrainNode
	}
	return Hold
}

// Last reports the last interval's GPU utilisation and attainment.
func (a *Autoscaler) Last() (util, attainment float64) { return a.lastUtil, a.lastAttn }

// Least returns the serving node with the fewest outstanding requests (the one to drain), or -1.
func (r *Router) Least() int {
	best := -1
	for i, n := range r.nodes {
		if n.State == Serving && (best < 0 || n.Outstanding < r.nodes[best].Outstanding) {
			best = i
		}
	}
	return best
}
