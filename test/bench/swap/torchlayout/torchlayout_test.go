package torchlayout

import (
	"strings"
	"testing"
	"time"
)

// params counts a model's parameters (its buffers left out), float32.
func params(m Model) uint64 {
	var n uint64
	for _, t := range m.Tensors {
		if strings.HasSuffix(t.Name, "running_mean") || strings.HasSuffix(t.Name, "running_var") ||
			strings.HasSuffix(t.Name, "num_batches_tracked") || strings.HasSuffix(t.Name, "_ids") {
			continue
		}
		n += t.Bytes / 4
	}
	return n
}

// TestModelsHaveTheirPublishedParameterCounts: the tensors are the real models' (torchvision's and transformers'
// parameter counts).
func TestModelsHaveTheirPublishedParameterCounts(t *testing.T) {
	for _, c := range []struct {
		depth int
		want  uint64
	}{{18, 11689512}, {34, 21797672}, {50, 25557032}, {101, 44549160}, {152, 60192808}} {
		m, err := ResNet(c.depth)
		if err != nil {
			t.Fatal(err)
		}
		if got := params(m); got != c.want {
			t.Errorf("%s: %d parameters, want %d", m.Name, got, c.want)
		}
	}
	for _, c := range []struct {
		size string
		want uint64
	}{{"base", 109482240}, {"large", 335141888}} {
		m, err := BERT(c.size)
		if err != nil {
			t.Fatal(err)
		}
		if got := params(m); got != c.want {
			t.Errorf("%s: %d parameters, want %d", m.Name, got, c.want)
		}
	}
	if _, err := ResNet(20); err == nil {
		t.Error("resnet20 was accepted")
	}
}

// TestLayoutFollowsTheCachingAllocator: small requests share 2 MiB segments, 1-10 MiB ones 20 MiB segments, larger
// ones get a segment of their own rounded to 2 MiB, a request takes the smallest free block that fits, and a large
// block is split only when more than 1 MiB is left.
func TestLayoutFollowsTheCachingAllocator(t *testing.T) {
	const mib = 1 << 20
	m := Layout("x", []Tensor{
		{Name: "a", Bytes: 100},         // small: a new 2 MiB segment, 512 bytes
		{Name: "b", Bytes: 3 * mib},     // a new 20 MiB segment
		{Name: "c", Bytes: 11 * mib},    // the 17 MiB left there
		{Name: "d", Bytes: 1000},        // after a
		{Name: "e", Bytes: 16*mib + 1},  // 6 MiB left in b's: a segment of its own, 18 MiB
		{Name: "f", Bytes: mib/2 + 512}, // small, after d
		{Name: "g", Bytes: 2 * mib},     // the smallest that fits: b's 6 MiB (e's has 2 MiB - 512)
		{Name: "h", Bytes: 12 * mib},    // nothing fits: its own
		{Name: "i", Bytes: 3 * mib / 2}, // e's 2 MiB - 512, the smaller; not split (under 1 MiB left)
		{Name: "j", Bytes: 3 * mib / 2}, // b's 4 MiB
	})
	want := []uint64{2 * mib, 20 * mib, 18 * mib, 12 * mib}
	if len(m.Segments) != len(want) {
		t.Fatalf("segments %v, want %v", m.Segments, want)
	}
	for i := range want {
		if m.Segments[i] != want[i] {
			t.Fatalf("segments %v, want %v", m.Segments, want)
		}
	}
	at := map[string][2]uint64{"a": {0, 0}, "b": {1, 0}, "c": {1, 3 * mib}, "d": {0, 512}, "e": {2, 0},
		"f": {0, 1536}, "g": {1, 14 * mib}, "h": {3, 0}, "i": {2, 16*mib + 512}, "j": {1, 16 * mib}}
	for _, tn := range m.Tensors {
		if w := at[tn.Name]; uint64(tn.Segment) != w[0] || tn.Offset != w[1] {
			t.Errorf("%s in segment %d at %d, want %d at %d", tn.Name, tn.Segment, tn.Offset, w[0], w[1])
		}
	}
}

// TestBest: a kernel waits for its segment and for the kernel before it.
func TestBest(t *testing.T) {
	m := Model{Tensors: []Tensor{{Segment: 0}, {Segment: 1}, {Segment: 1}}, Segments: []uint64{1, 1}}
	p, s := m.Best([]time.Duration{4, 4}, []time.Duration{5, 1, 2})
	if p != 4+5+1+2 || s != 8+8 { // the first kernel ends at 9, after the second segment (8)
		t.Fatalf("best %v, serial %v", p, s)
	}
}
