package topology

import (
	"math"
	"testing"
	"time"
)

// sharedSwitchNode: two GPUs behind one switch, 1 GB/s each and 1 GB/s of uplink, no fixed latency.
func sharedSwitchNode(t *testing.T, sameSwitch float64) *Node {
	t.Helper()
	n, err := Parse([]byte(`name: pair
gpus:
- {name: g0, memory_bytes: 1000000000, pcie_switch: 0, copy_engines: 1, h2d_bytes_per_sec: 1e9}
- {name: g1, memory_bytes: 1000000000, pcie_switch: 0, copy_engines: 1, h2d_bytes_per_sec: 1e9}
switch_uplink_bytes_per_sec: [1e9]
`))
	if err != nil {
		t.Fatal(err)
	}
	n.Slowdown.HostSameSwitch = sameSwitch
	if err := n.Validate(); err != nil {
		t.Fatal(err)
	}
	return &n
}

var t0 = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }

// TestTransfersTwoSided: A (100 MB) starts alone at 0 and moves at 1 GB/s; B (100 MB) starts at 50 ms behind the
// same switch. From then on both move at 0.5 GB/s: A, 50 MB left, ends at 150 ms (the one-sided model, which fixed
// A's rate at its start, said 100 ms); B, 50 MB left at 150, finishes alone at 200 ms (one-sided: 250 ms).
func TestTransfersTwoSided(t *testing.T) {
	tr := NewTransfers(sharedSwitchNode(t, 0))
	tr.Start(at(0), 1, HostPath(0), 100e6)
	if e, _ := tr.Next(); e.ID != 1 || !e.At.Equal(at(100)) {
		t.Fatalf("alone: next = %+v, want 1 at 100ms", e)
	}
	// Predicted at 0: a transfer into GPU 1 starting at 50 ms takes 150 ms (50 MB at half speed, 50 MB alone).
	if d := tr.Predict(at(0), at(50), HostPath(1), 100e6); d != 150*time.Millisecond {
		t.Errorf("Predict = %v, want 150ms", d)
	}
	tr.Start(at(50), 2, HostPath(1), 100e6)
	ends := tr.Ends(at(50))
	if len(ends) != 2 || ends[0].ID != 1 || !ends[0].At.Equal(at(150)) || ends[1].ID != 2 || !ends[1].At.Equal(at(200)) {
		t.Fatalf("projected ends = %+v, want 1 at 150ms, 2 at 200ms", ends)
	}
	e, ok := tr.Next()
	if !ok || e.ID != 1 || !e.At.Equal(at(150)) {
		t.Fatalf("next = %+v, want 1 at 150ms", e)
	}
	if !tr.End(e.At, 1) || tr.End(e.At, 1) {
		t.Fatal("End: want true once, then false")
	}
	if e, _ := tr.Next(); e.ID != 2 || !e.At.Equal(at(200)) {
		t.Fatalf("after A: next = %+v, want 2 at 200ms", e)
	}
	if start, ok := tr.Started(2); !ok || !start.Equal(at(50)) {
		t.Errorf("Started(2) = %v %v", start, ok)
	}
	// Ending B early (its request aborted) leaves nothing.
	tr.End(at(160), 2)
	if _, ok := tr.Next(); ok || tr.Len() != 0 {
		t.Errorf("after both: %d in progress", tr.Len())
	}
}

// TestTransfersStatedSlowdown: with host_same_switch 1.64 (Torpor Table 3: 25 ms alone, 41 ms beside another
// swap), two 25 MB transfers behind one switch started together each take 25 x 1.64 = 41 ms.
func TestTransfersStatedSlowdown(t *testing.T) {
	n := sharedSwitchNode(t, 1.64)
	if s := n.SlowdownOf(HostPath(0), []Path{HostPath(1)}); math.Abs(s-1.64) > 1e-12 {
		t.Fatalf("slowdown = %v, want 1.64", s)
	}
	tr := NewTransfers(n)
	tr.Start(at(0), 1, HostPath(0), 25e6)
	tr.Start(at(0), 2, HostPath(1), 25e6)
	for _, e := range tr.Ends(at(0)) {
		if !e.At.Equal(at(41)) {
			t.Errorf("transfer %d ends at %v, want 41ms", e.ID, e.At.Sub(t0))
		}
	}
	bad := *n
	bad.Slowdown.HostSameSwitch = 0.5
	if err := bad.Validate(); err == nil {
		t.Error("host_same_switch 0.5 accepted")
	}
}
