package remoting

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
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

// TestGlobalsLostWithAFaultAreAnError: a fault tears down the function's context, and with it the module whose
// global the function wrote. A new load would give the global its initial value and the function would compute
// wrong answers with them; instead its calls fail (CUDA_ERROR_CONTEXT_IS_DESTROYED) and its next request is
// refused with ErrLost (its process must start again), while its model blocks alone would have come back from its
// image.
func TestGlobalsLostWithAFaultAreAnError(t *testing.T) {
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
	g, _, r := h.CuModuleGetGlobal_v2(ctx, mod, "table")
	if r != ResultSuccess {
		t.Fatalf("global: %v", r)
	}
	if r := h.CuMemcpyHtoD_v2(ctx, g, []byte("written at init"), 15); r != ResultSuccess {
		t.Fatalf("htod to the global: %v", r)
	}
	kmod, r := h.CuModuleLoadData(ctx, kernels.PTX(), uint64(len(kernels.PTX())))
	if r != ResultSuccess {
		t.Fatalf("load kernels: %v", r)
	}
	va, r := h.CuModuleGetFunction(ctx, make([]byte, 4+8*wireParamMax), kmod, "vector_add")
	if r != ResultSuccess {
		t.Fatalf("vector_add: %v", r)
	}
	blk, r := h.CuMemAlloc_v2(ctx, 4096)
	if r != ResultSuccess {
		t.Fatalf("alloc: %v", r)
	}
	b.bind("f", 1) // its first request: the initialisation ends, its block is its image
	args := binary.LittleEndian.AppendUint64(nil, 0x1000)
	args = binary.LittleEndian.AppendUint64(args, blk)
	args = binary.LittleEndian.AppendUint64(args, blk)
	args = binary.LittleEndian.AppendUint32(args, 4)
	if r := h.CuLaunchKernel(ctx, va, 1, 1, 1, 32, 1, 1, 0, 0, args, 0); r != ResultSuccess {
		t.Fatalf("launch: %v", r)
	}
	if r := h.CuCtxSynchronize(ctx); r != ResultIllegalAddress {
		t.Fatalf("the fault: %v, want CUDA_ERROR_ILLEGAL_ADDRESS", r)
	}
	out := make([]byte, 15)
	if r := h.CuMemcpyDtoH_v2(ctx, out, g, 15); r != ResultContextIsDestroyed {
		t.Fatalf("reading the global after the fault: %v %q, want CUDA_ERROR_CONTEXT_IS_DESTROYED", r, out)
	}
	if err := xn.EndInit(ctx, "f"); !errors.Is(err, executor.ErrLost) {
		t.Fatalf("the function's next request: %v, want ErrLost", err)
	}
}

// TestImplicitBindingGivenUpAfterMaxHold: calls outside a request that keep coming keep their implicit binding
// no longer than Config.MaxImplicitHold: then the session gives the GPU up and binds again (queueing behind the
// requests waiting for it), so an initialisation that never pauses cannot keep other functions off the GPU.
func TestImplicitBindingGivenUpAfterMaxHold(t *testing.T) {
	ctx := context.Background()
	dev, xn := simNode(t, 64<<20)
	b := &binder{current: map[string]int{}, implicit: 1}
	h, err := newDeviceHandler(ctx, Config{Device: dev, Node: xn, Binder: b, MaxImplicitHold: 20 * time.Millisecond},
		SessionInfo{Function: "f", Spec: pool.FunctionSpec{Name: "f", MemoryBytes: 16 << 20}}, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for i := range 3 {
		if _, r := h.CuMemAlloc_v2(ctx, 4096); r != ResultSuccess {
			t.Fatalf("alloc %d: %v", i, r)
		}
		time.Sleep(30 * time.Millisecond) // longer than the hold (no session here: nothing releases on idle)
	}
	b.mu.Lock()
	released := b.released
	b.mu.Unlock()
	if released != 2 {
		t.Fatalf("the implicit binding was given up %d times over three calls 30ms apart, want 2 (hold 20ms)",
			released)
	}
}
