package controller

import (
	"slices"
	"sort"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// Status reports the controller's view of the node in the pool's status shape.
func (c *Controller) Status() pool.Status {
	st := pool.Status{Policy: string(c.cfg.Policy), Queued: c.q.Len()}
	// A function's instances (pool.InstanceKey) are shown as the function: their copies, requests and counts are its.
	for i, g := range c.gpus {
		gs := pool.GPUStatus{Index: i, Name: c.node.GPUs[i].Name, MemoryBytes: g.capacity, UsedBytes: g.used,
			Busy: g.busy != 0, Healthy: !g.unhealthy, Resident: []string{}}
		for name := range g.resident {
			fn, _ := pool.SplitInstance(name)
			gs.Resident = append(gs.Resident, fn)
		}
		sort.Strings(gs.Resident)
		gs.Resident = slices.Compact(gs.Resident)
		gs.CoRunners = c.coRunnerStatus(i)
		st.GPUs = append(st.GPUs, gs)
	}
	byName := map[string]*pool.FunctionStatus{}
	for _, fs := range c.fns {
		fn, inst := pool.SplitInstance(fs.Name)
		s, _ := c.q.Stats(fs.Name)
		f := byName[fn]
		if f == nil {
			f = &pool.FunctionStatus{FunctionSpec: fs.FunctionSpec, Resident: []int{}}
			f.Name = fn
			byName[fn] = f
			// The instances of a function keep one SLO record (queueing.Queue.SetFamily): counted once.
			f.Served, f.OnTime = s.Served, s.OnTime
		}
		if inst == "" {
			f.FunctionSpec = fs.FunctionSpec
		} else {
			f.Instances++
		}
		f.Queued += s.Waiting
		f.Running += fs.inFlight
		f.Resident = append(f.Resident, fs.replicas...)
		f.Refused += fs.refused
		f.Shed = f.Shed || fs.shed
	}
	for _, f := range byName {
		sort.Ints(f.Resident)
		f.Resident = slices.Compact(f.Resident)
		st.Functions = append(st.Functions, *f)
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

// InstanceResident reports whether an instance of function (pool.InstanceKey) has a complete copy on a GPU.
func (c *Controller) InstanceResident(function string) bool {
	for name := range c.fns {
		if fn, inst := pool.SplitInstance(name); inst != "" && fn == function && c.Resident(name) {
			return true
		}
	}
	return false
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
