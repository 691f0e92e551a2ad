package sim_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
)

// TestSharedPhysicalMemory: an allocation written in one backend, exported and imported by another (as the
// gpuserver lends a chunk to a tenant executor), holds the same bytes there; what one writes the other reads; a
// memset of the whole allocation in the exporter (the zeroing between tenants) reads as zeros in the importer; an
// allocation that is mapped cannot be exported, an imported one cannot be exported again, and a descriptor of the
// wrong size is refused.
func TestSharedPhysicalMemory(t *testing.T) {
	ctx := context.Background()
	a, b := newSim(t, sim.Options{}), newSim(t, sim.Options{})
	const size = 2 << 20
	phys, err := a.CreatePhysical(1, size)
	must(t, err)
	pa, err := a.ReserveAddress(size, 0)
	must(t, err)
	must(t, a.Map(pa, phys))
	must(t, a.SetAccess(pa, size, []int{1}))
	sa, err := a.NewStream(1)
	must(t, err)
	secret := bytes.Repeat([]byte("tenant A's weights "), 1000)
	must(t, sa.CopyHtoD(pa+4096, secret))
	must(t, sa.Synchronize(ctx))
	if _, err := a.ExportPhysical(phys); err == nil {
		t.Fatal("a mapped allocation was exported")
	}
	must(t, a.Unmap(pa, size))
	f, err := a.ExportPhysical(phys)
	must(t, err)
	if _, err := b.ImportPhysical(1, size/2, f); err == nil {
		t.Fatal("a descriptor of another size was imported")
	}
	imp, err := b.ImportPhysical(1, size, f)
	must(t, err)
	must(t, f.Close())
	if _, err := b.ExportPhysical(imp); err == nil {
		t.Fatal("an imported allocation was exported again")
	}
	pb, err := b.ReserveAddress(size, 0)
	must(t, err)
	must(t, b.Map(pb, imp))
	must(t, b.SetAccess(pb, size, []int{1}))
	sb, err := b.NewStream(1)
	must(t, err)
	got := make([]byte, len(secret))
	must(t, sb.CopyDtoH(got, pb+4096))
	must(t, sb.Synchronize(ctx))
	if !bytes.Equal(got, secret) {
		t.Fatal("the importer reads other bytes than the exporter wrote")
	}
	must(t, sb.Memset8(pb, 7, 16))
	must(t, sb.Synchronize(ctx))
	must(t, a.Map(pa, phys))
	must(t, a.SetAccess(pa, size, []int{1}))
	seven := make([]byte, 16)
	must(t, sa.CopyDtoH(seven, pa))
	must(t, sa.Synchronize(ctx))
	if !bytes.Equal(seven, bytes.Repeat([]byte{7}, 16)) {
		t.Fatalf("the exporter reads %v after the importer's memset", seven)
	}
	must(t, sa.Memset8(pa, 0, size)) // the zeroing of a chunk passing to another tenant
	must(t, sa.Synchronize(ctx))
	must(t, sb.CopyDtoH(got, pb+4096))
	must(t, sb.Synchronize(ctx))
	if !bytes.Equal(got, make([]byte, len(got))) {
		t.Fatal("the importer still reads the bytes the exporter zeroed")
	}
	must(t, b.Unmap(pb, size))
	must(t, imp.Release())
	must(t, a.Unmap(pa, size))
	must(t, phys.Release())
	var _ device.Sharer = a
}
