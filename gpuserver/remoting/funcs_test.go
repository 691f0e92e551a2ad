package remoting

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// setsBackend is the simulated node whose kernels take attribute sets as the cuda backend's do, recording them.
type setsBackend struct {
	*sim.Backend
	mu   sync.Mutex
	sets map[int]map[device.FuncAttr]int32 // gpu -> the attributes set on its kernel
}

type setsModule struct {
	device.Module
	b *setsBackend
}

type setsFunction struct {
	device.Function
	b   *setsBackend
	gpu int
}

func (b *setsBackend) LoadModule(gpu int, image []byte) (device.Module, error) {
	m, err := b.Backend.LoadModule(gpu, image)
	return setsModule{m, b}, err
}

// NewContext: the functions' modules are loaded in their tenants' contexts.
func (b *setsBackend) NewContext(gpu int) (device.Context, error) {
	c, err := b.Backend.NewContext(gpu)
	return setsContext{c, b}, err
}

type setsContext struct {
	device.Context
	b *setsBackend
}

func (c setsContext) LoadModule(image []byte) (device.Module, error) {
	m, err := c.Context.LoadModule(image)
	return setsModule{m, c.b}, err
}

func (m setsModule) Function(name string) (device.Function, error) {
	f, err := m.Module.Function(name)
	return setsFunction{f, m.b, m.GPU()}, err
}

func (f setsFunction) Attribute(a device.FuncAttr) (int32, error) {
	f.b.mu.Lock()
	defer f.b.mu.Unlock()
	return f.b.sets[f.gpu][a], nil
}

func (f setsFunction) SetAttribute(a device.FuncAttr, v int32) error {
	f.b.mu.Lock()
	defer f.b.mu.Unlock()
	if f.b.sets[f.gpu] == nil {
		f.b.sets[f.gpu] = map[device.FuncAttr]int32{}
	}
	f.b.sets[f.gpu][a] = v
	return nil
}

// TestFunctionAttributeSetsFollowTheFunction: an attribute set while the function runs on one GPU is applied to
// its kernel on every GPU it later runs on (the kernel of another GPU's module is a different driver object).
func TestFunctionAttributeSetsFollowTheFunction(t *testing.T) {
	dev, _ := simNode(t, 64<<20)
	b := &setsBackend{Backend: dev, sets: map[int]map[device.FuncAttr]int32{}}
	xn := simNodeOn(t, b, 64<<20)
	bd := &binder{current: map[string]int{}}
	cfg := Config{Device: b, Node: xn, Functions: registry{}, Binder: bd}
	ctx := context.Background()
	info := SessionInfo{Function: "f", Spec: pool.FunctionSpec{Name: "f", MemoryBytes: 64 << 20}}
	h, err := newDeviceHandler(ctx, cfg, info, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	bd.bind("f", 0)
	mod, r := h.CuModuleLoadData(ctx, kernels.PTX(), 0)
	if r != ResultSuccess {
		t.Fatalf("load: %d", r)
	}
	params := make([]byte, 4+8*wireParamMax)
	fn, r := h.CuModuleGetFunction(ctx, params, mod, "vector_add")
	if r != ResultSuccess {
		t.Fatalf("function: %d", r)
	}
	if r := h.CuFuncSetAttribute(ctx, fn, int32(device.FuncMaxDynamicSharedSizeBytes), 65536); r != ResultSuccess {
		t.Fatalf("set: %d", r)
	}
	if r := h.CuFuncSetAttribute(ctx, fn, int32(device.FuncNumRegs), 12); r != ResultInvalidValue {
		t.Fatalf("a set of a read-only attribute: %d", r)
	}
	for _, gpu := range []int{0, 2, 3} {
		bd.bind("f", gpu)
		v, r := h.CuFuncGetAttribute(ctx, int32(device.FuncMaxDynamicSharedSizeBytes), fn)
		if r != ResultSuccess || v != 65536 {
			t.Fatalf("gpu %d: attribute %d (%d)", gpu, v, r)
		}
		if got := b.sets[gpu][device.FuncMaxDynamicSharedSizeBytes]; got != 65536 {
			t.Errorf("gpu %d: the kernel there has %d", gpu, got)
		}
	}
	if _, ok := b.sets[1]; ok {
		t.Error("gpu 1 never ran the function but got the set")
	}
	// A new set reaches every GPU again, at its next use there.
	if r := h.CuFuncSetAttribute(ctx, fn, int32(device.FuncMaxDynamicSharedSizeBytes), 1024); r != ResultSuccess {
		t.Fatal(r)
	}
	bd.bind("f", 0)
	if _, r := h.CuFuncGetAttribute(ctx, int32(device.FuncMaxDynamicSharedSizeBytes), fn); r != ResultSuccess {
		t.Fatal(r)
	}
	if got := b.sets[0][device.FuncMaxDynamicSharedSizeBytes]; got != 1024 {
		t.Errorf("gpu 0 after the second set: %d", got)
	}
}
