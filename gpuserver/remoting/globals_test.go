package remoting

import (
	"context"
	"log/slog"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// TestGlobalsFollowTheFunction: a module global keeps the one address the function got from cuModuleGetGlobal
// (translated to the module's global on whichever GPU runs the function), and its bytes move with the function;
// the function's blocks keep their bytes across the executors' swap.
func TestGlobalsFollowTheFunction(t *testing.T) {
	ctx := context.Background()
	dev, xn := simNode(t, 64<<20)
	b := &binder{current: map[string]int{}, implicit: 1}
	h, err := newDeviceHandler(ctx, Config{Device: dev, Node: xn, Binder: b},
		SessionInfo{Function: "f", Spec: pool.FunctionSpec{Name: "f", MemoryBytes: 16 << 20}}, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ptx := []byte(".version 7.0\n.target sm_50\n.address_size 64\n.visible .global .align 4 .b8 table[64];\n")
	mod, r := h.CuModuleLoadData(ctx, ptx, uint64(len(ptx)))
	if r != ResultSuccess {
		t.Fatalf("load: %v", r)
	}
	g, size, r := h.CuModuleGetGlobal_v2(ctx, mod, "table")
	if r != ResultSuccess || size != 64 {
		t.Fatalf("global: %#x %d %v", g, size, r)
	}
	blk, r := h.CuMemAlloc_v2(ctx, 4<<20)
	if r != ResultSuccess {
		t.Fatalf("alloc: %v", r)
	}
	if r := h.CuMemcpyHtoD_v2(ctx, g+8, []byte("global bytes"), 12); r != ResultSuccess {
		t.Fatalf("htod to the global: %v", r)
	}
	if r := h.CuMemcpyHtoD_v2(ctx, blk, []byte("model bytes"), 11); r != ResultSuccess {
		t.Fatalf("htod to the block: %v", r)
	}
	b.bind("f", 3) // the first request runs on GPU 3: initialisation ends, the function moves
	out := make([]byte, 12)
	if r := h.CuMemcpyDtoH_v2(ctx, out, g+8, 12); r != ResultSuccess || string(out) != "global bytes" {
		t.Fatalf("global on gpu 3: %q %v", out, r)
	}
	if r := h.CuMemcpyDtoH_v2(ctx, out[:11], blk, 11); r != ResultSuccess || string(out[:11]) != "model bytes" {
		t.Fatalf("block on gpu 3: %q %v", out[:11], r)
	}
	if _, active, _ := xn.Resident("f"); active != 3 || !xn.Captured("f") {
		t.Fatalf("function active on %d (captured %v), want gpu 3 after its initialisation", active, xn.Captured("f"))
	}
	// The bytes are in the module's own global on GPU 3, not at the address of GPU 1's.
	on3, err := h.globalOn(h.globals[0], 3)
	if err != nil || uint64(on3) == g {
		t.Fatalf("global on gpu 3 at %#x (%v), gpu 1's at %#x", uint64(on3), err, g)
	}
	raw := make([]byte, 12)
	if err := h.copyOnce(ctx, 3, func(s device.Stream) error { return s.CopyDtoH(raw, on3+8) }); err != nil ||
		string(raw) != "global bytes" {
		t.Fatalf("gpu 3's global holds %q (%v)", raw, err)
	}
	g2, _, r := h.CuModuleGetGlobal_v2(ctx, mod, "table")
	if r != ResultSuccess || g2 != g {
		t.Fatalf("the global's address changed with the GPU: %#x then %#x", g, g2)
	}
	if r := h.CuMemcpyHtoD_v2(ctx, g+64, []byte("x"), 1); r != ResultInvalidValue {
		t.Fatalf("copy past the global: %v, want refused", r)
	}
}
