// Package router picks, for each request of a function, which of several nodes (each a gpuserver with its GPU
// pool) serves it, places and replicates functions' host images over the nodes, and decides when to add or drain
// a node (Autoscaler). It has no I/O and no clock: the caller (the provider in front of several gpuservers, or
// the cluster simulator) feeds it what it learns - requests routed and finished, 429 answers with Retry-After,
// which models are resident on a node's GPUs - and every call that needs the time takes now. A Router is not safe
// for concurrent use.
//
// A request goes to a node that does not shed its function, preferring, among nodes whose load (outstanding
// requests per GPU) is within Slack of the least loaded one: a node holding the model on a GPU, then a node
// holding its host image, then the least loaded. Choosing a node without the image places (replicates) the image
// there; the caller charges the load. Images beyond a node's host memory are dropped least recently used.
package router

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Errors of the router.
var (
	ErrNoNode          = errors.New("no node can take the request")
	ErrUnknownFunction = errors.New("unknown function")
	ErrUnknownNode     = errors.New("unknown node")
	ErrInvalidConfig   = errors.New("invalid router config")
)

// DefaultSlack is Config.Slack's default: outstanding requests per GPU a node may carry beyond the least loaded
// node and still be preferred for locality.
const DefaultSlack = 1.0

// Config configures a Router.
type Config struct {
	// Slack: see DefaultSlack; 0 means the default, a negative value is refused.
	Slack float64
	// RoundRobin ignores residency, images and load: each request goes to the next node that takes it (the
	// baseline the routing is measured against, and the fallback when nothing is known of the nodes).
	RoundRobin bool
}

// Residency tells the router whether a node holds a function's model on a GPU (from the node's pool status, or
// the simulator's controllers).
type Residency interface {
	Resident(node int, function string) bool
}

// State of a node.
type State int

// Node states: Serving nodes take requests; Draining nodes take none and are removed once their outstanding
// requests have finished; Removed nodes are gone (their index is not reused).
const (
	Serving State = iota
	Draining
	Removed
)

func (s State) String() string {
	return [...]string{"serving", "draining", "removed"}[s]
}

// Node is the router's view of one node.
type Node struct {
	Name  string
	GPUs  int
	State State
	// HostMemoryBytes is how many bytes of host images the node holds; 0 is unlimited.
	HostMemoryBytes uint64
	// Outstanding is the number of requests routed to the node and not finished.
	Outstanding int
	// Added is when the node was added (for accounting).
	Added time.Time

	images    map[string]time.Time // function -> last use
	imageSize uint64
	shedUntil map[string]time.Time
}

// Load is the node's outstanding requests per GPU.
func (n *Node) Load() float64 { return float64(n.Outstanding) / float64(max(1, n.GPUs)) }

// HasImage reports whether the node holds function's host image.
func (n *Node) HasImage(function string) bool { _, ok := n.images[function]; return ok }

// Images is the number of host images the node holds.
func (n *Node) Images() int { return len(n.images) }

// Router routes requests over nodes.
type Router struct {
	cfg    Config
	nodes  []*Node
	fnSize map[string]uint64
	counts Counters
	cand   []int
	next   int // round robin: the node to try first
}

// Counters are the router's totals.
type Counters struct {
	Routed       int64 // requests routed
	Resident     int64 // ... to a node holding the model on a GPU
	Image        int64 // ... to a node holding only the host image
	Placed       int64 // images placed or replicated on a node (each one an image load)
	ImageDropped int64 // images dropped for host memory
	Retried      int64 // picks that skipped a node shedding the function
}

// Pick is a routing decision.
type Pick struct {
	Node int
	// LoadImage: the node lacks the function's host image and loads it first (a placement or replication).
	LoadImage bool
	// Resident: the node holds the model on a GPU.
	Resident bool
}

// New returns a router without nodes.
func New(cfg Config) (*Router, error) {
	if cfg.Slack < 0 {
		return nil, fmt.Errorf("%w: slack must be >= 0", ErrInvalidConfig)
	}
	if cfg.Slack == 0 {
		cfg.Slack = DefaultSlack
	}
	return &Router{cfg: cfg, fnSize: map[string]uint64{}}, nil
}

// AddNode adds a serving node and returns its index.
func (r *Router) AddNode(now time.Time, name string, gpus int, hostMemoryBytes uint64) int {
	r.nodes = append(r.nodes, &Node{Name: name, GPUs: gpus, HostMemoryBytes: hostMemoryBytes, Added: now,
		images: map[string]time.Time{}, shedUntil: map[string]time.Time{}})
	return len(r.nodes) - 1
}

// Nodes returns the nodes (indexed as AddNode returned them); the caller must not change them.
func (r *Router) Nodes() []*Node { return r.nodes }

// Counters returns the totals so far.
func (r *Router) Counters() Counters { return r.counts }

// Serving is the number of serving nodes.
func (r *Router) Serving() int {
	n := 0
	for _, nd := range r.nodes {
		if nd.State == Serving {
			n++
		}
	}
	return n
}

// Register adds a function with its host image size and places the image on the serving node with the fewest
// image bytes (the lowest index on a tie); it returns that node, or -1 when no node serves.
func (r *Router) Register(now time.Time, function string, imageBytes uint64) int {
	r.fnSize[function] = imageBytes
	best := -1
	for i, n := range r.nodes {
		if n.State == Serving && (best < 0 || n.imageSize < r.nodes[best].imageSize) {
			best = i
		}
	}
	if best >= 0 {
		r.place(now, r.nodes[best], function)
	}
	return best
}

// Route picks the node for a request of function and counts it as outstanding there (Finished ends it).
func (r *Router) Route(now time.Time, function string, res Residency) (Pick, error) {
	if _, ok := r.fnSize[function]; !ok {
		return Pick{}, fmt.Errorf("%w: %q", ErrUnknownFunction, function)
	}
	r.cand = r.cand[:0]
	minLoad := 0.0
	for i, n := range r.nodes {
		if r.takes(now, n, function) {
			if len(r.cand) == 0 || n.Load() < minLoad {
				minLoad = n.Load()
			}
			r.cand = append(r.cand, i)
		}
	}
	if len(r.cand) == 0 {
		return Pick{}, fmt.Errorf("%w: %q (every serving node sheds it or none serves)", ErrNoNode, function)
	}
	best, bestTier := -1, 0
	if r.cfg.RoundRobin {
		best = r.cand[0]
		for _, i := range r.cand {
			if i >= r.next {
				best = i
				break
			}
		}
		r.next = best + 1
		bestTier = 2
		switch {
		case res != nil && res.Resident(best, function):
			bestTier = 0
		case r.nodes[best].HasImage(function):
			bestTier = 1
		}
	}
	for _, i := range r.cand {
		if r.cfg.RoundRobin {
			break
		}
		n := r.nodes[i]
		if n.Load() > minLoad+r.cfg.Slack {
			continue
		}
		tier := 2
		switch {
		case res != nil && res.Resident(i, function):
			tier = 0
		case n.HasImage(function):
			tier = 1
		}
		if best < 0 || tier < bestTier || tier == bestTier && n.Load() < r.nodes[best].Load() {
			best, bestTier = i, tier
		}
	}
	n := r.nodes[best]
	p := Pick{Node: best, Resident: bestTier == 0}
	if !n.HasImage(function) {
		p.LoadImage = bestTier != 0 // a model on a GPU came from the node's host image
		r.place(now, n, function)
	}
	n.images[function] = now
	n.Outstanding++
	r.counts.Routed++
	switch bestTier {
	case 0:
		r.counts.Resident++
	case 1:
		r.counts.Image++
	}
	return p, nil
}

// takes reports whether node n takes a request of function now.
func (r *Router) takes(now time.Time, n *Node, function string) bool {
	if n.State != Serving {
		return false
	}
	if until, ok := n.shedUntil[function]; ok {
		if now.Before(until) {
			r.counts.Retried++
			return false
		}
		delete(n.shedUntil, function)
	}
	return true
}

// place puts function's image on n, dropping the least recently used images not in use beyond its host memory.
func (r *Router) place(now time.Time, n *Node, function string) {
	if n.HasImage(function) {
		return
	}
	size := r.fnSize[function]
	n.images[function] = now
	n.imageSize += size
	r.counts.Placed++
	if n.HostMemoryBytes == 0 || n.imageSize <= n.HostMemoryBytes {
		return
	}
	type img struct {
		fn   string
		last time.Time
	}
	var imgs []img
	for f, last := range n.images {
		if f != function {
			imgs = append(imgs, img{f, last})
		}
	}
	slices.SortFunc(imgs, func(a, b img) int {
		if c := a.last.Compare(b.last); c != 0 {
			return c
		}
		return cmp.Compare(a.fn, b.fn)
	})
	for _, im := range imgs {
		if n.imageSize <= n.HostMemoryBytes {
			break
		}
		delete(n.images, im.fn)
		n.imageSize -= r.fnSize[im.fn]
		r.counts.ImageDropped++
	}
}

// Finished ends a request routed to node.
func (r *Router) Finished(node int) error {
	if node < 0 || node >= len(r.nodes) {
		return fmt.Errorf("%w: %d", ErrUnknownNode, node)
	}
	n := r.nodes[node]
	n.Outstanding = max(0, n.Outstanding-1)
	if n.State == Draining && n.Outstanding == 0 {
		n.State = Removed
	}
	return nil
}

// Shed records that node answered a request of function with 429 and Retry-After: it takes none of its requests
// until until. The request itself ends there (Finished is implied) and the caller routes it again.
func (r *Router) Shed(node int, function string, until time.Time) error {
	if node < 0 || node >= len(r.nodes) {
		return fmt.Errorf("%w: %d", ErrUnknownNode, node)
	}
	r.nodes[node].shedUntil[function] = until
	return r.Finished(node)
}

// Drain stops routing to node; it is Removed once its outstanding requests have finished (at once when none).
func (r *Router) Drain(node int) error {
	if node < 0 || node >= len(r.nodes) {
		return fmt.Errorf("%w: %d", ErrUnknownNode, node)
	}
	n := r.nodes[node]
	if n.State != Serving {
		return nil
	}
	n.State = Draining
	if n.Outstanding == 0 {
		n.State = Removed
	}
	return nil
}
