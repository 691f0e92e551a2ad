package controller

import (
	"sort"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// Status reports the controller's view of the node in the pool's status shape.
func (c *Controller) Status() pool.Status {
	st := pool.Status{Policy: string(c.cfg.Policy), Queued: c.q.Len()}
	for i, g := range c.gpus {
		gs := pool.GPUStatus{Index: i, Name: c.node.GPUs[i].Name, MemoryBytes: g.capacity, UsedBytes: g.used,
			Busy: g.busy != 0, Healthy: !g.unhealthy, Resident: []string{}}
		for name := range g.resident {
			gs.Resident = append(gs.Resident, name)
		}
		sort.Strings(gs.Resident)
		st.GPUs = append(st.GPUs, gs)
	}
	for _, fs := range c.fns {
		s, _ := c.q.Stats(fs.Name)
		res := append([]int{}, fs.replicas...)
		sort.Ints(res)
		st.Functions = append(st.Functions, pool.FunctionStatus{FunctionSpec: fs.FunctionSpec, Queued: s.Waiting,
			Running: fs.inFlight, Resident: res, Served: s.Served, OnTime: s.OnTime, Refused: fs.refused,
			Shed: fs.shed})
	}
	sort.Slice(st.Functions, func(i, j int) bool { return st.Functions[i].Name < st.Functions[j].Name })
	sum := pool.Summarize(st.Functions)
	st.SLO = &sum
	ov := c.Overload()
	st.Overload = &pool.OverloadView{Setting: ov.Setting, Demand: ov.Demand, Capacity: ov.Capacity,
		Shedding: ov.Shedding, Refused: c.counts.Shed}
	ev := pool.EvictionCounts{Controller: c.counts.Evictions, DataPlane: map[string]int64{}}
	for k, v := range c.counts.DataPlaneEvictions {
		ev.DataPlane[k] = v
	}
	st.Evictions = &ev
	return st
}

// Resident reports whether function has a complete copy on a GPU (for a router choosing among nodes).
func (c *Controller) Resident(function string) bool {
	fs := c.fns[function]
	if fs == nil {
		return false
	}
	for _, gi := range fs.replicas {
		if !c.gpus[gi].resident[function].loading {
			return true
		}
	}
	return false
}
