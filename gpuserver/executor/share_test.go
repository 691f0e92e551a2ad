package executor_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// TestVariantSwapInMovesOnlyItsOwnChunks: four variants of one base model (the same base bytes, a head each, one
// tenant, each saying it never writes its model: SetModelShared) captured on GPU 1 and evicted there, and a fifth
// function with the same base that did not say so (it copies everything and shares nothing). The first swap-in to GPU 0 copies its whole image; the next variants,
// while the first is resident, copy only their heads and map the base's chunks already on the GPU (read-only: a copy
// or a kernel's write into a shared chunk faults); every variant reads back its own bytes; the shared chunks go back to the pool with
// the last copy holding them.
func TestVariantSwapInMovesOnlyItsOwnChunks(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 128<<20, sim.Options{}, false)
	models := captureVariants(t, r, 1)
	free0 := r.node.Status()[0].FreeBytes
	swapInVariants(t, r, models)

	// The base is read-only: a copy into it is refused before it reaches the device.
	s, err := r.node.Stream(models[1].name)
	must(t, err)
	if err := s.CopyHtoD(models[1].blocks[0], make([]byte, 16)); !errors.Is(err, executor.ErrReadOnly) {
		t.Fatalf("a copy into a shared chunk: %v, want ErrReadOnly", err)
	}
	for _, m := range models {
		must(t, r.node.SwapIn(ctx, m.name, 0, executor.Host))
		verify(t, r, m, 0)
	}
	// So does a kernel's write into it (the sim checks the reference kernels' writes; a dry launch, which computes
	// nothing, cannot be checked).
	s, err = r.node.Stream(models[2].name)
	must(t, err)
	dctx, err := r.node.Context(models[2].name, 0)
	must(t, err)
	mod, err := dctx.LoadModule(kernels.PTX())
	must(t, err)
	fill, err := mod.Function("fill")
	must(t, err)
	args, err := device.PackArgs(fill.Params(), models[2].blocks[0], float32(1), uint32(256))
	must(t, err)
	must(t, s.Launch(fill, device.Dim3{X: 1}, device.Dim3{X: 256}, 0, args))
	if err := s.Synchronize(ctx); !errors.Is(err, device.ErrIllegalAddress) {
		t.Fatalf("a kernel writing into a shared chunk: %v, want ErrIllegalAddress", err)
	}
	for _, m := range models {
		must(t, r.node.SwapIn(ctx, m.name, 0, executor.Host))
		verify(t, r, m, 0)
	}
	evictVariants(t, r, models, free0)
}

// TestSharedWeightsAreReadOnlyToTheFirstVariantToo: a hostile variant swaps in first, alone on the GPU, and writes
// into its base weights (the chunks another variant will map): its copies and memsets are refused with ErrReadOnly,
// its kernel's write faults (its work, not the GPU: the honest variant comes back from its image); the honest
// variant that swaps in beside it maps the base chunks and reads the true weights every time. Before, a chunk was
// read-only only once a second copy mapped it: the first variant's writes succeeded and the honest variant read
// the attacker's bytes as its weights.
func TestSharedWeightsAreReadOnlyToTheFirstVariantToo(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 128<<20, sim.Options{}, false)
	models := captureVariants(t, r, 1)
	hostile, honest := models[0], models[1]
	evil := pattern(4096, 0xEE)

	must(t, r.node.SwapIn(ctx, hostile.name, 0, executor.Host)) // the only user of the base chunks on gpu 0
	s, err := r.node.Stream(hostile.name)
	must(t, err)
	if err := s.CopyHtoD(hostile.blocks[0], evil); !errors.Is(err, executor.ErrReadOnly) {
		t.Fatalf("the first variant's copy into its shared weights: %v, want ErrReadOnly", err)
	}
	if err := s.Memset8(hostile.blocks[0]+4096, 0xEE, 4096); !errors.Is(err, executor.ErrReadOnly) {
		t.Fatalf("the first variant's memset of its shared weights: %v, want ErrReadOnly", err)
	}
	if err := s.CopyDtoD(hostile.blocks[0], hostile.blocks[1], 4096); !errors.Is(err, executor.ErrReadOnly) {
		t.Fatalf("the first variant's device copy into its shared weights: %v, want ErrReadOnly", err)
	}
	must(t, s.Synchronize(ctx)) // nothing of it reached the device
	must(t, r.node.SwapIn(ctx, honest.name, 0, executor.Host))
	verify(t, r, honest, 0)
	if r.node.Sharing().ResidentShared == 0 {
		t.Fatal("the honest variant shares no chunk with the hostile one: the test no longer covers the attack")
	}
	verify(t, r, hostile, 0)

	// A kernel of the first variant, alone again, writes into the base: the write faults, the writer gets the
	// error.
	must(t, r.node.Evict(ctx, honest.name, 0))
	must(t, r.node.Evict(ctx, hostile.name, 0))
	must(t, r.node.SwapIn(ctx, hostile.name, 0, executor.Host))
	s, err = r.node.Stream(hostile.name)
	must(t, err)
	dctx, err := r.node.Context(hostile.name, 0)
	must(t, err)
	mod, err := dctx.LoadModule(kernels.PTX())
	must(t, err)
	fill, err := mod.Function("fill")
	must(t, err)
	args, err := device.PackArgs(fill.Params(), hostile.blocks[0], float32(-7), uint32(1024))
	must(t, err)
	must(t, s.Launch(fill, device.Dim3{X: 4}, device.Dim3{X: 256}, 0, args))
	if err := s.Synchronize(ctx); !errors.Is(err, device.ErrIllegalAddress) {
		t.Fatalf("the first variant's kernel writing into its shared weights: %v, want ErrIllegalAddress", err)
	}
	must(t, r.node.SwapIn(ctx, honest.name, 0, executor.Host))
	verify(t, r, honest, 0)
	must(t, r.node.SwapIn(ctx, hostile.name, 0, executor.Host))
	verify(t, r, hostile, 0)
	if r.node.Sharing().ResidentShared == 0 {
		t.Fatal("the variants share no chunk after the fault: the test no longer covers the attack")
	}
	verify(t, r, honest, 0)
}

// TestCUDAVariantSwapInMovesOnlyItsOwnChunks is the sharing of TestVariantSwapInMovesOnlyItsOwnChunks on the real
// driver (make gpu-test): the variants captured on GPU 0 and evicted, then swapped in one after the other: the
// later ones copy only their heads and map the base's physical chunks read-only at their own addresses, each reads
// back its own bytes, and every byte goes back to the pool with the last copy. (The faulting writes are the sim's
// part: on a GPU a fault poisons the process's contexts.)
func TestCUDAVariantSwapInMovesOnlyItsOwnChunks(t *testing.T) {
	if os.Getenv("FAAS_GPU_TEST_CUDA") != "1" {
		t.Skip("needs an NVIDIA GPU: set FAAS_GPU_TEST_CUDA=1 (make gpu-test)")
	}
	dev, err := cuda.Open("")
	if err != nil {
		t.Fatalf("FAAS_GPU_TEST_CUDA=1 but the driver cannot be opened: %v", err)
	}
	r := newRigOn(t, dev, false)
	models := captureVariants(t, r, 0)
	free0 := r.node.Status()[0].FreeBytes
	swapInVariants(t, r, models)
	// A copy into the shared base is refused before it reaches the driver (no fault), by the first variant too.
	s, err := r.node.Stream(models[0].name)
	must(t, err)
	if err := s.CopyHtoD(models[0].blocks[0], make([]byte, 16)); !errors.Is(err, executor.ErrReadOnly) {
		t.Fatalf("a copy into a shared chunk: %v, want ErrReadOnly", err)
	}
	for _, m := range models {
		verify(t, r, m, 0)
	}
	evictVariants(t, r, models, free0)
}

// captureVariants registers four variants of one base (8 chunks of the same bytes, a head chunk each, sharing their
// model) and a fifth function with the same base that does not share, captures each on GPU gpu and evicts it.
func captureVariants(t *testing.T, r *rig, gpu int) []model {
	t.Helper()
	ctx := context.Background()
	cs := r.node.ChunkSize()
	base := make([]byte, 8*cs)
	g := rand.NewChaCha8([32]byte{7})
	_, _ = g.Read(base)
	var models []model
	for i := range 5 {
		m := model{name: fmt.Sprintf("llm-%d", i)}
		if i == 4 {
			m.name = "private" // the same base, but it did not say it never writes its model: nothing shared
		}
		must(t, r.node.Register(m.name))
		must(t, r.node.SetModelShared(m.name, i < 4))
		b, err := r.node.Acquire(ctx, m.name, gpu, executor.Host)
		must(t, err)
		s, err := r.node.Stream(m.name)
		must(t, err)
		for _, d := range [][]byte{base, pattern(int(cs), byte(10+i))} {
			p, err := r.node.Alloc(ctx, m.name, uint64(len(d)))
			must(t, err)
			must(t, s.CopyHtoD(p, d))
			m.blocks, m.data = append(m.blocks, p), append(m.data, d)
		}
		must(t, s.Synchronize(ctx))
		must(t, r.node.Capture(ctx, m.name))
		b.Release()
		must(t, r.node.Evict(ctx, m.name, gpu))
		models = append(models, m)
	}
	return models
}

// swapInVariants swaps the models of captureVariants in to GPU 0 from host memory one after the other: the first
// copies its whole image, the other variants only their heads, the private function everything.
func swapInVariants(t *testing.T, r *rig, models []model) {
	t.Helper()
	ctx := context.Background()
	cs := r.node.ChunkSize()
	for i, m := range models {
		before, shared := r.node.Status()[0], r.node.Sharing().SharedBytes
		must(t, r.node.SwapIn(ctx, m.name, 0, executor.Host))
		verify(t, r, m, 0)
		after := r.node.Status()[0]
		moved, mapped := after.SwapBytes-before.SwapBytes, r.node.Sharing().SharedBytes-shared
		took := before.FreeBytes - after.FreeBytes
		t.Logf("%s: %d bytes copied, %d mapped from chunks on the gpu, %d bytes of gpu memory taken", m.name, moved,
			mapped, took)
		want := 9 * cs
		if i > 0 && i < 4 {
			want = cs // only its head
		}
		if moved != want || took != want || mapped != 9*cs-want {
			t.Fatalf("%s: copied %d, took %d, shared %d; want %d, %d, %d", m.name, moved, took, mapped, want, want,
				9*cs-want)
		}
	}
	for _, m := range models {
		verify(t, r, m, 0)
	}
	if st := r.node.Sharing(); st.ResidentShared != 8*cs {
		t.Fatalf("resident shared %d, want the base's %d", st.ResidentShared, 8*cs)
	}
}

// evictVariants evicts the models one after the other from GPU 0: the others still read their bytes, and the last
// eviction gives every byte back (free0: GPU 0's free bytes before the swap-ins).
func evictVariants(t *testing.T, r *rig, models []model, free0 uint64) {
	t.Helper()
	ctx := context.Background()
	for i, m := range models {
		must(t, r.node.Evict(ctx, m.name, 0))
		for _, o := range models[i+1:] {
			verify(t, r, o, 0)
		}
	}
	if got := r.node.Status()[0].FreeBytes; got != free0 {
		t.Fatalf("free bytes %d after evicting every variant, want %d", got, free0)
	}
}
