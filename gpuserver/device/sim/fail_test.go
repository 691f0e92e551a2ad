package sim_test

import (
	"context"
	"errors"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
)

func TestReserveAddressAtGivesTheAddressOrFails(t *testing.T) {
	b := newSim(t, sim.Options{})
	const g = sim.DefaultGranularity
	p, err := b.ReserveAddress(4*g, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReserveAddressAt(p+g, g); !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("reserving inside a reservation: %v, want ErrOutOfMemory", err)
	}
	if _, err := b.ReserveAddressAt(p+1, g); !errors.Is(err, device.ErrInvalidValue) {
		t.Fatalf("unaligned address: %v, want ErrInvalidValue", err)
	}
	want := p + 64*g
	got, err := b.ReserveAddressAt(want, 2*g)
	if err != nil || got != want {
		t.Fatalf("ReserveAddressAt(%#x) = %#x, %v", uint64(want), uint64(got), err)
	}
	// Later reservations never overlap it, and it maps like any other.
	for range 80 {
		q, err := b.ReserveAddress(g, 0)
		if err != nil {
			t.Fatal(err)
		}
		if q+g > want && q < want+2*g {
			t.Fatalf("ReserveAddress gave %#x inside the fixed reservation at %#x", uint64(q), uint64(want))
		}
	}
	phys, err := b.CreatePhysical(0, 2*g)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Map(want, phys); err != nil {
		t.Fatal(err)
	}
	if err := b.Unmap(want, 2*g); err != nil {
		t.Fatal(err)
	}
	if err := b.FreeAddress(want, 2*g); err != nil {
		t.Fatal(err)
	}
	if err := phys.Release(); err != nil {
		t.Fatal(err)
	}
}

func TestFailGPUFailsItsStreamsUntilRepaired(t *testing.T) {
	b := newSim(t, sim.Options{})
	ctx := context.Background()
	p := mapOn(t, b, 1, sim.DefaultGranularity)
	s1, err := b.NewStream(1)
	if err != nil {
		t.Fatal(err)
	}
	s0, err := b.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Destroy()
	defer s0.Destroy()
	ecc := errors.New("uncorrectable ECC error")
	if err := b.FailGPU(1, ecc); err != nil {
		t.Fatal(err)
	}
	if err := b.FailGPU(9, ecc); !errors.Is(err, device.ErrInvalidValue) {
		t.Fatalf("FailGPU(9): %v", err)
	}
	if err := s1.Memset8(p, 7, 16); err != nil { // asynchronous: reported at the next synchronisation
		t.Fatal(err)
	}
	ev, err := b.NewEvent(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s1.Record(ev); err != nil {
		t.Fatal(err)
	}
	if err := ev.Synchronize(ctx); !errors.Is(err, ecc) {
		t.Fatalf("event after work on the failed gpu: %v, want the injected error", err)
	}
	if err := s1.Synchronize(ctx); !errors.Is(err, ecc) {
		t.Fatalf("synchronize on the failed gpu: %v, want the injected error", err)
	}
	q := mapOn(t, b, 0, sim.DefaultGranularity)
	if err := s0.Memset8(q, 1, 16); err != nil {
		t.Fatal(err)
	}
	if err := s0.Synchronize(ctx); err != nil {
		t.Fatalf("another gpu's stream: %v", err)
	}
	if err := b.FailGPU(1, nil); err != nil {
		t.Fatal(err)
	}
	if err := s1.Memset8(p, 7, 16); err != nil {
		t.Fatal(err)
	}
	if err := s1.Synchronize(ctx); err != nil {
		t.Fatalf("after repair: %v", err)
	}
}
