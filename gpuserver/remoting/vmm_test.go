package remoting

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// TestVMMMappingsFollowTheFunction: memory mapped into a reservation (PyTorch's expandable segments) during the
// function's initialisation is part of its model: captured at its first request, it keeps its address and bytes
// when the function moves to another GPU, like any block of the function.
func TestVMMMappingsFollowTheFunction(t *testing.T) {
	dev, xn := simNode(t, 256<<20)
	bd := &binder{current: map[string]int{}}
	cfg := Config{Device: dev, Node: xn, Functions: registry{}, Binder: bd}
	ctx := context.Background()
	info := SessionInfo{Function: "f", Spec: pool.FunctionSpec{Name: "f", MemoryBytes: 64 << 20}}
	h, err := newDeviceHandler(ctx, cfg, info, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	gran := xn.ChunkSize()
	base, r := h.CuMemAddressReserve(ctx, 4*gran, 0, 0, 0)
	if r != ResultSuccess {
		t.Fatalf("reserve: %d", r)
	}
	prop := make([]byte, 32)
	binary.LittleEndian.PutUint32(prop[0:], memAllocationTypePinned)
	binary.LittleEndian.PutUint32(prop[8:], memLocationTypeDevice)
	if _, r := h.CuMemCreate(ctx, 64<<20+gran, prop, 0); r != ResultOutOfMemory {
		t.Fatalf("a physical allocation over the quota: %d", r)
	}
	ph, r := h.CuMemCreate(ctx, 2*gran, prop, 0)
	if r != ResultSuccess {
		t.Fatalf("create: %d", r)
	}
	if r := h.CuMemMap(ctx, base+gran, 2*gran, 0, ph, 0); r != ResultSuccess {
		t.Fatalf("map: %d", r)
	}
	data := bytes.Repeat([]byte("fixed addresses "), 4096)
	at := base + 2*gran - 1000
	if r := h.CuMemcpyHtoD_v2(ctx, at, data, uint64(len(data))); r != ResultSuccess {
		t.Fatalf("copy in: %d", r)
	}
	for _, gpu := range []int{3, 0} {
		bd.bind("f", gpu)
		back := make([]byte, len(data))
		if r := h.CuMemcpyDtoH_v2(ctx, back, at, uint64(len(back))); r != ResultSuccess {
			t.Fatalf("gpu %d: copy out: %d", gpu, r)
		}
		if !bytes.Equal(back, data) {
			t.Fatalf("gpu %d: the mapping's bytes changed", gpu)
		}
	}
	if r := h.CuMemFree_v2(ctx, base+gran); r != ResultInvalidValue {
		t.Fatalf("cuMemFree of a mapping: %d", r)
	}
	if r := h.CuMemUnmap(ctx, base+gran, 2*gran); r != ResultSuccess {
		t.Fatalf("unmap: %d", r)
	}
	if r := h.CuMemcpyHtoD_v2(ctx, at, data[:8], 8); r != ResultInvalidValue {
		t.Fatalf("a copy into unmapped memory: %d", r)
	}
	if r := h.CuMemRelease(ctx, ph); r != ResultSuccess || h.used != 0 {
		t.Fatalf("release: %d, %d bytes still counted", r, h.used)
	}
	if r := h.CuMemAddressFree(ctx, base, 4*gran); r != ResultSuccess {
		t.Fatalf("free the reservation: %d", r)
	}
}
