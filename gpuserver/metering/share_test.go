package metering

import (
	"errors"
	"testing"
	"time"
)

// A co-runner's GPU seconds are its time bound times the share it was granted, piecewise as the share moves; its
// memory byte-seconds are its quota times the time (memory is not shared); an exclusive binding counts 1.
func TestGPUSecondsTimesTheShareGranted(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 2, 10, 30, 0, 0, time.UTC)}
	m := open(t, Config{Now: c.now})
	const gib = 1 << 30
	m.Begin("x", "excl", gib)
	m.Begin("s", "shared", gib)
	if err := m.SetShare("s", 0.5); err != nil {
		t.Fatal(err)
	}
	c.add(2 * time.Second)
	if err := m.SetShare("s", 0.75); err != nil { // scaled up by its controller
		t.Fatal(err)
	}
	c.add(4 * time.Second)
	m.End("s")
	m.End("x")
	r := m.Report(time.Time{})
	if got := usage(r, "shared"); !near(got.GPUSeconds, 0.5*2+0.75*4) || !near(got.GPUMemoryByteSeconds, 6*gib) {
		t.Errorf("shared: %+v, want 4 GPU seconds (2 s at 0.5, 4 s at 0.75) and 6 GiB-seconds", got)
	}
	if got := usage(r, "excl"); !near(got.GPUSeconds, 6) {
		t.Errorf("exclusive: %+v, want 6 GPU seconds", got)
	}
	for _, bad := range []float64{0, -0.1, 1.5} {
		if err := m.SetShare("x", bad); !errors.Is(err, ErrInvalidShare) {
			t.Errorf("SetShare(%v) = %v, want ErrInvalidShare", bad, err)
		}
	}
	if err := m.SetShare("gone", 0.5); err != nil {
		t.Errorf("SetShare of an ended binding: %v, want it ignored", err)
	}
}
