package router

import (
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// NodeReport is what a node's gpuserver last reported (its pool status, GET /v1/pool), for choosing among a
// function's replicas.
type NodeReport struct {
	// At is when the report was taken; a report older than the picker's maxAge is not used.
	At time.Time
	// GPUs is the number of healthy GPUs; Queued the requests waiting for one.
	GPUs, Queued int
	// Resident holds the functions with a complete copy of their model on a GPU; Shedding those the node's
	// overload control sheds.
	Resident, Shedding map[string]bool
}

// ReportOf summarises a pool status taken at at.
func ReportOf(st pool.Status, at time.Time) NodeReport {
	r := NodeReport{At: at, Queued: st.Queued, Resident: map[string]bool{}, Shedding: map[string]bool{}}
	for _, g := range st.GPUs {
		if g.Healthy {
			r.GPUs++
		}
	}
	for _, f := range st.Functions {
		if len(f.Resident) > 0 {
			r.Resident[f.Name] = true
		}
		if f.Shed {
			r.Shedding[f.Name] = true
		}
	}
	return r
}

// Replica is one ready replica of a function and the node it runs on.
type Replica struct {
	Addr string
	Node string
}

// Reason says what decided a replica pick.
type Reason string

// The reasons of PickReplica, from the best to the fallback.
const (
	// PickResident: the replica's node holds the function's model on a GPU (and does not shed it).
	PickResident Reason = "resident"
	// PickLeastQueued: no fresh node holds the model; the node with the fewest queued requests per GPU.
	PickLeastQueued Reason = "least_queued"
	// PickShedding: every node with a fresh report sheds the function; the least queued of them.
	PickShedding Reason = "shedding"
	// PickRoundRobin: no replica's node has a fresh report.
	PickRoundRobin Reason = "round_robin"
)

// PickReplica chooses, among a function's ready replicas, the one whose node is best for a request now, from the
// nodes' reports no older than maxAge: a node that does not shed the function first, then one with the model on
// a GPU, then the fewest queued requests per GPU; ties go round robin from rr. When no replica's node has a fresh
// report, it falls back to round robin (rr modulo the replicas). It returns the replica's index (-1 without
// replicas) and what decided. function is the function's name on the gpuservers.
func PickReplica(now time.Time, function string, replicas []Replica, reports map[string]NodeReport,
	maxAge time.Duration, rr uint64) (int, Reason) {
	if len(replicas) == 0 {
		return -1, PickRoundRobin
	}
	best, bestTier, bestLoad := -1, 0, 0.0
	n := len(replicas)
	for k := range n {
		i := int((rr + uint64(k)) % uint64(n))
		rep, ok := reports[replicas[i].Node]
		if !ok || now.Sub(rep.At) > maxAge || rep.GPUs == 0 {
			continue
		}
		tier := 2
		switch {
		case rep.Shedding[function]:
			tier = 3
		case rep.Resident[function]:
			tier = 0
		}
		load := float64(rep.Queued) / float64(rep.GPUs)
		if best < 0 || tier < bestTier || tier == bestTier && load < bestLoad {
			best, bestTier, bestLoad = i, tier, load
		}
	}
	switch {
	case best < 0:
		return int(rr % uint64(n)), PickRoundRobin
	case bestTier == 0:
		return best, PickResident
	case bestTier == 2:
		return best, PickLeastQueued
	default:
		return best, PickShedding
	}
}
