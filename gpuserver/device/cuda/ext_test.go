package cuda_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/attrs"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
)

// TestCUDADriverExtensions: what protocol 1.1 asks of the real driver - the GPU's complete attribute table and
// UUID, function attributes (a set read back), the module's kernel list, cuLaunchKernelEx with a cluster (sm_90)
// and a completion event, timed events, and a tensor map encoded by the driver. GPU suite: FAAS_GPU_TEST_CUDA=1.
func TestCUDADriverExtensions(t *testing.T) {
	b := openCUDA(t)
	ctx := context.Background()
	g := b.GPUs()[0]
	if g.Attributes.Get(attrs.MultiprocessorCount) == 0 || g.Attributes.Get(attrs.WarpSize) != 32 ||
		int(g.Attributes.Get(attrs.ComputeCapabilityMajor)*10+g.Attributes.Get(attrs.ComputeCapabilityMinor)) !=
			g.ComputeCapability {
		t.Fatalf("attribute table: %v", g.Attributes[:20])
	}
	if _, err := device.ParseUUID(g.UUID); err != nil {
		t.Fatalf("UUID %q: %v", g.UUID, err)
	}
	t.Logf("gpu 0: %s %s, %d SMs", g.Name, g.UUID, g.Attributes.Get(attrs.MultiprocessorCount))

	m, err := b.LoadModule(0, kernels.PTX())
	must(t, err)
	defer m.Unload()
	em, ok := m.(device.EnumerableModule)
	if !ok {
		t.Fatal("the cuda module lists no kernels")
	}
	if names := em.FunctionNames(); len(names) != len(kernels.Names()) {
		t.Errorf("kernels %v, want %v", names, kernels.Names())
	}
	f, err := m.Function("vector_add")
	must(t, err)
	cf, ok := f.(device.ConfigurableFunction)
	if !ok {
		t.Fatal("the cuda function takes no attributes")
	}
	must(t, cf.SetAttribute(device.FuncMaxDynamicSharedSizeBytes, 65536))
	if v, err := cf.Attribute(device.FuncMaxDynamicSharedSizeBytes); err != nil || v != 65536 {
		t.Errorf("max dynamic shared memory after the set: %d %v", v, err)
	}
	if v, err := cf.Attribute(device.FuncNumRegs); err != nil || v <= 0 {
		t.Errorf("registers: %d %v", v, err)
	}

	const n = 1 << 16
	size := uint64(4 * n)
	gran := g.Granularity
	alloc := (3*size + gran - 1) / gran * gran
	base := mapOn(t, b, 0, alloc)
	a, bb, c := base, base+device.Ptr(size), base+device.Ptr(2*size)
	host := make([]byte, size)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(host[4*i:], math.Float32bits(float32(i)))
	}
	s, err := b.NewStream(0)
	must(t, err)
	defer s.Destroy()
	must(t, s.CopyHtoD(a, host))
	must(t, s.CopyHtoD(bb, host))
	start, err := b.NewTimedEvent(0)
	must(t, err)
	done, err := b.NewTimedEvent(0)
	must(t, err)
	args := make([]byte, 28)
	binary.LittleEndian.PutUint64(args[0:], uint64(a))
	binary.LittleEndian.PutUint64(args[8:], uint64(bb))
	binary.LittleEndian.PutUint64(args[16:], uint64(c))
	binary.LittleEndian.PutUint32(args[24:], n)
	var la []device.LaunchAttribute
	if g.ComputeCapability >= 90 {
		cl := device.LaunchAttribute{ID: device.LaunchAttrClusterDimension}
		binary.LittleEndian.PutUint32(cl.Value[0:], 2)
		binary.LittleEndian.PutUint32(cl.Value[4:], 1)
		binary.LittleEndian.PutUint32(cl.Value[8:], 1)
		la = append(la, cl)
	}
	la = append(la, device.LaunchAttribute{ID: device.LaunchAttrLaunchCompletionEvent, Event: done})
	must(t, s.Record(start))
	xl, ok := s.(device.ExtendedLauncher)
	if !ok {
		t.Fatal("the cuda stream has no LaunchEx")
	}
	must(t, xl.LaunchEx(f, device.Dim3{X: n / 256}, device.Dim3{X: 256}, 0, la, args))
	must(t, done.Synchronize(ctx))
	if d, err := done.Elapsed(start); err != nil || d < 0 {
		t.Errorf("elapsed %v %v", d, err)
	}
	out := make([]byte, size)
	must(t, s.CopyDtoH(out, c))
	must(t, s.Synchronize(ctx))
	want := make([]byte, size)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(want[4*i:], math.Float32bits(float32(2*i)))
	}
	if !bytes.Equal(out, want) {
		t.Error("vector_add through cuLaunchKernelEx computed something else")
	}

	if g.ComputeCapability >= 90 {
		enc := b
		req := device.TensorMapRequest{Kind: device.TensorMapTiled, DataType: 7, Rank: 2, GlobalAddress: a,
			GlobalDim: [5]uint64{256, 256}, GlobalStrides: [4]uint64{1024}, BoxDim: [5]uint32{32, 32},
			ElementStride: [5]uint32{1, 1}}
		m1, err := enc.EncodeTensorMap(0, req)
		must(t, err)
		m2, err := enc.ReplaceTensorMapAddress(0, m1, bb)
		must(t, err)
		if m1 == m2 {
			t.Error("replacing the address changed nothing")
		}
		req.GlobalAddress = a + 4
		if _, err := enc.EncodeTensorMap(0, req); err == nil {
			t.Error("the driver encoded an unaligned address")
		}
	}
}
