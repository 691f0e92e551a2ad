package sim_test

import (
	"context"
	"errors"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
)

// TestHealthCheckFollowsTheDeviceState: device.CheckHealth passes on a working simulated GPU, fails (ErrCheckFailed,
// with the device's own error) on one failed by FailGPU while the others pass, and passes again once it is repaired;
// a fault that poisoned the process's contexts (ProcessWide) fails it too, as a real driver's answers would in that
// process (the gpuserver runs the check in a process no tenant's kernel ran in).
func TestHealthCheckFollowsTheDeviceState(t *testing.T) {
	ctx := context.Background()
	b := newSim(t, sim.Options{})
	for g := range b.GPUs() {
		if err := device.CheckHealth(ctx, b, g); err != nil {
			t.Fatalf("gpu %d: %v", g, err)
		}
	}
	ecc := errors.New("xid 48: double bit ECC error")
	if err := b.FailGPU(2, ecc); err != nil {
		t.Fatal(err)
	}
	if err := device.CheckHealth(ctx, b, 2); !errors.Is(err, device.ErrCheckFailed) || !errors.Is(err, ecc) {
		t.Fatalf("the failed gpu: %v, want ErrCheckFailed wrapping the injected error", err)
	}
	if err := device.CheckHealth(ctx, b, 1); err != nil {
		t.Fatalf("another gpu beside the failed one: %v", err)
	}
	if err := b.FailGPU(2, nil); err != nil {
		t.Fatal(err)
	}
	if err := device.CheckHealth(ctx, b, 2); err != nil {
		t.Fatalf("the repaired gpu: %v", err)
	}
	if err := device.CheckHealth(ctx, b, 9); !errors.Is(err, device.ErrInvalidValue) {
		t.Fatalf("gpu 9: %v, want ErrInvalidValue", err)
	}

	pw := newSim(t, sim.Options{ProcessWide: true})
	p := mapOn(t, pw, 0, sim.DefaultGranularity)
	c, err := pw.NewContext(0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Destroy()
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	_ = s.CopyDtoD(p, 0x1000, 16) // an illegal address: poisons every context of the process
	if err := s.Synchronize(ctx); !device.IsContextFault(err) {
		t.Fatalf("the faulting copy: %v", err)
	}
	if err := device.CheckHealth(ctx, pw, 0); !errors.Is(err, device.ErrCheckFailed) {
		t.Fatalf("the check in the poisoned process: %v, want ErrCheckFailed", err)
	}
}
