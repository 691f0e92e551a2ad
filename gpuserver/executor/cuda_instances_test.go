package executor_test

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// TestCUDAInstancesServeOneFunctionOnSeveralGPUsAtOnce (GPU suite, step 7) is TestSiblingInstanceIsASwapSource and
// the gpuserver's TestInstancesAreBoundOnSeveralGPUsAtOnce on the real driver: two instances of one function (m@1,
// m@2, model shared), initialised on GPUs 0 and 1 at addresses of their own; m@2, evicted, swaps in on GPU 1 reading
// its weights from m@1's copy on GPU 0 where the GPUs reach each other (peer to peer: NVLink where there is one);
// then both are bound at once, each on its GPU, their kernels in flight together, and each answers from its own
// bytes.
func TestCUDAInstancesServeOneFunctionOnSeveralGPUsAtOnce(t *testing.T) {
	if os.Getenv("FAAS_GPU_TEST_CUDA") != "1" {
		t.Skip("needs an NVIDIA GPU: set FAAS_GPU_TEST_CUDA=1 (make gpu-test)")
	}
	dev, err := cuda.Open("")
	if err != nil {
		t.Fatalf("FAAS_GPU_TEST_CUDA=1 but the driver cannot be opened: %v", err)
	}
	if n := len(dev.GPUs()); n < 2 {
		t.Skipf("needs 2 GPUs to serve one function on several at once: this machine has %d (%s)", n,
			dev.GPUs()[0].Name)
	}
	r := newRigOn(t, dev, false)
	ctx := context.Background()
	sizes := []int{3 << 20, 4000, 4000} // a block of its own, then vector_add's two inputs
	for _, fn := range []string{"m@1", "m@2"} {
		must(t, r.node.Register(fn))
		must(t, r.node.SetModelShared(fn, true))
	}
	ms := []model{initModel(t, r, "m@1", 0, sizes...), initModel(t, r, "m@2", 1, sizes...)}
	must(t, r.node.Evict(ctx, "m@2", 1))
	must(t, r.node.SwapIn(ctx, "m@2", 1, 0))
	verify(t, r, ms[1], 1)
	if dev.CanAccessPeer(1, 0) {
		if got := r.node.Status()[1].SiblingBytes; got == 0 {
			t.Errorf("GPU 1 reaches GPU 0, but m@2's swap-in copied nothing from m@1's copy there")
		}
	} else {
		t.Log("GPU 1 does not reach GPU 0 (no peer access): m@2's swap-in read its host image")
	}

	// Both bound at once, each on its GPU, both kernels launched before either is waited for.
	type run struct {
		s       device.Stream
		out     device.Ptr
		release func()
	}
	var runs []run
	for gpu, m := range ms {
		b, err := r.node.Acquire(ctx, m.name, gpu, executor.Host)
		must(t, err)
		if b.GPU() != gpu {
			t.Fatalf("%s bound on gpu %d, want %d", m.name, b.GPU(), gpu)
		}
		out, err := r.node.Alloc(ctx, m.name, 4000)
		must(t, err)
		s, err := r.node.Stream(m.name)
		must(t, err)
		dctx, err := r.node.Context(m.name, gpu)
		must(t, err)
		mod, err := dctx.LoadModule(kernels.PTX())
		must(t, err)
		t.Cleanup(func() { _ = mod.Unload() })
		va, err := mod.Function("vector_add")
		must(t, err)
		args, err := device.PackArgs(va.Params(), m.blocks[1], m.blocks[2], out, uint32(1000))
		must(t, err)
		must(t, s.Launch(va, device.Dim3{X: 4}, device.Dim3{X: 256}, 0, args))
		runs = append(runs, run{s, out, b.Release})
	}
	for i, rn := range runs {
		got := make([]byte, 4000)
		must(t, rn.s.CopyDtoH(got, rn.out))
		must(t, rn.s.Synchronize(ctx))
		m := ms[i]
		for k := range 1000 {
			a := math.Float32frombits(binary.LittleEndian.Uint32(m.data[1][4*k:]))
			c := math.Float32frombits(binary.LittleEndian.Uint32(m.data[2][4*k:]))
			v := math.Float32frombits(binary.LittleEndian.Uint32(got[4*k:]))
			if v != a+c && !(math.IsNaN(float64(v)) && math.IsNaN(float64(a+c))) {
				t.Fatalf("%s on gpu %d: c[%d] = %v, want %v", m.name, i, k, v, a+c)
			}
		}
	}
	for _, rn := range runs {
		rn.release()
	}
	for _, m := range ms {
		must(t, r.node.Deregister(ctx, m.name))
	}
}
