package controller

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// TestPropertyPartialResidency drives the controller with partial residency through random submits, swaps and
// completions (and a GPU failing and returning) and checks after every step: a GPU's used bytes are its full
// copies' quotas plus its partial copies' bytes and never exceed its capacity; a partial copy holds at most the bytes
// of its model and never sits beside a full copy of the same function; a swap moves exactly the bytes the
// target lacked.
func TestPropertyPartialResidency(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, p := range []Policy{PolicyFaaSGPU, PolicyTorpor, PolicyGShareDQLS} {
		c, err := New(Config{Policy: p, Node: sharedSwitchNode(t), PartialResidency: true})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(3, 4))
		var fns []string
		for i, mb := range []uint64{40, 60, 90, 120, 150, 70} {
			name := string(rune('a' + i))
			fns = append(fns, name)
			if err := c.Register(t0, Function{FunctionSpec: pool.FunctionSpec{Name: name, MemoryBytes: mb << 20,
				SLO: time.Second}, ModelBytes: mb << 19, ExecSeed: 5 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
		}
		now := t0
		var bound []uint64
		var id uint64
		partialSeen := 0
		for step := range 3000 {
			now = now.Add(time.Duration(rng.IntN(10)) * time.Millisecond)
			switch {
			case step == 1500:
				if _, err := c.SetHealthy(now, 1, false); err != nil {
					t.Fatal(err)
				}
			case step == 2000:
				if _, err := c.SetHealthy(now, 1, true); err != nil {
					t.Fatal(err)
				}
			case len(bound) > 0 && rng.IntN(2) == 0:
				i := rng.IntN(len(bound))
				_, _ = c.Complete(now, bound[i], 5*time.Millisecond) // a failed GPU's request reports it
				bound = slices.Delete(bound, i, i+1)
			default:
				id++
				_ = c.Submit(now, id, fns[rng.IntN(len(fns))]) // shed or not
			}
			before := map[[2]int]uint64{}
			for _, g := range c.gpus {
				for name, pc := range g.partial {
					before[[2]int{g.index, slices.Index(fns, name)}] = pc.bytes
				}
			}
			for _, d := range c.Dispatch(now) {
				bound = append(bound, d.Request)
				if d.Swap == SwapNone {
					continue
				}
				kept := before[[2]int{d.GPU, slices.Index(fns, d.Function)}]
				if want := c.fns[d.Function].ModelBytes - kept; d.Bytes != want {
					t.Fatalf("%s step %d: swap of %s into %d moves %d bytes, lacked %d", p, step, d.Function, d.GPU,
						d.Bytes, want)
				}
			}
			for _, g := range c.gpus {
				var sum uint64
				for name := range g.resident {
					sum += c.fns[name].footprint
				}
				for name, pc := range g.partial {
					partialSeen++
					if pc.bytes == 0 || pc.bytes >= c.fns[name].ModelBytes+1 || g.resident[name] != nil {
						t.Fatalf("%s step %d: partial copy of %s on %d: %d bytes (model %d), full copy %v", p, step,
							name, g.index, pc.bytes, c.fns[name].ModelBytes, g.resident[name] != nil)
					}
					sum += pc.bytes
				}
				if g.used != sum || g.used > g.capacity {
					t.Fatalf("%s step %d: GPU %d used %d, copies %d, capacity %d", p, step, g.index, g.used, sum,
						g.capacity)
				}
			}
		}
		if partialSeen == 0 {
			t.Errorf("%s: no partial copy ever kept", p)
		}
	}
}
