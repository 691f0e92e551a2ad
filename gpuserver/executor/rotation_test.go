package executor_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// mlp2 is a two-layer perceptron held by one function: y = relu(x W1 + b1) W2 + b2, computed with the sim's
// reference kernels on the function's stream. Its weights are deterministic per seed, so the answer a function
// gives is known on the host (reference) and must not change whatever path its model took.
const (
	mlpIn, mlpHidden, mlpOut = 512, 1024, 256
)

type mlp2 struct {
	name   string
	seed   int
	layers [2]struct{ w, b device.Ptr }
}

// weights of layer l (0 or 1) for seed: k x n values in [-1/32, 1/32) and n biases.
func mlpWeights(seed, l int) (w, b []float32) {
	k, n := mlpIn, mlpHidden
	if l == 1 {
		k, n = mlpHidden, mlpOut
	}
	w, b = make([]float32, k*n), make([]float32, n)
	x := uint32(seed*7919 + l*104729 + 1)
	next := func() float32 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		return (float32(x%2048) - 1024) / 32768
	}
	for i := range w {
		w[i] = next()
	}
	for i := range b {
		b[i] = next()
	}
	return w, b
}

func mlpInput() []float32 {
	x := make([]float32, mlpIn)
	for i := range x {
		x[i] = float32(i%13-6) / 6
	}
	return x
}

// gemmRef is the sim's linear kernel for one row, in the same order of operations (so the result is exact).
func gemmRef(a, w, bias []float32, k, n int) []float32 {
	acc := append([]float32(nil), bias...)
	for kk := range k {
		for j := range n {
			acc[j] = float32(math.FMA(float64(a[kk]), float64(w[kk*n+j]), float64(acc[j])))
		}
	}
	return acc
}

func (m mlp2) reference() []byte {
	w1, b1 := mlpWeights(m.seed, 0)
	w2, b2 := mlpWeights(m.seed, 1)
	h := gemmRef(mlpInput(), w1, b1, mlpIn, mlpHidden)
	for i := range h {
		h[i] = max(h[i], 0)
	}
	return f32(gemmRef(h, w2, b2, mlpHidden, mlpOut))
}

// acquireRetry binds fn to gpu; a copy still pinned as the source of a finishing swap, or a GPU whose memory is
// taken by such a copy, answers at once with an error the caller retries (the controller would wait too).
func acquireRetry(t *testing.T, r *rig, fn string, gpu int) *executor.Binding {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		b, err := r.node.Acquire(context.Background(), fn, gpu, executor.Any)
		if err == nil {
			return b
		}
		if !errors.Is(err, executor.ErrNoMemory) && !errors.Is(err, executor.ErrPinned) || time.Now().After(deadline) {
			t.Fatalf("acquire %s on gpu %d: %v", fn, gpu, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// initLayer is one step of m's initialisation on gpu, as the remoting server runs calls made outside a request:
// bound for the step only, then released, so that other functions may evict or move m before its next step.
func (m *mlp2) initLayer(t *testing.T, r *rig, gpu, l int) {
	t.Helper()
	ctx := context.Background()
	b := acquireRetry(t, r, m.name, gpu)
	defer b.Release()
	s, err := r.node.Stream(m.name)
	must(t, err)
	w, bias := mlpWeights(m.seed, l)
	pw, err := r.node.Alloc(ctx, m.name, uint64(4*len(w)))
	must(t, err)
	pb, err := r.node.Alloc(ctx, m.name, uint64(4*len(bias)))
	must(t, err)
	must(t, s.CopyHtoD(pw, f32(w)))
	must(t, s.CopyHtoD(pb, f32(bias)))
	must(t, s.Synchronize(ctx))
	m.layers[l].w, m.layers[l].b = pw, pb
}

// request is one request of m on gpu, as the gpuserver serves it: its initialisation ends first (the pool's
// acquire does that), then the forward pass runs on the bound GPU into scratch blocks it frees again.
func (m *mlp2) request(t *testing.T, r *rig, gpu int) []byte {
	t.Helper()
	ctx := context.Background()
	must(t, r.node.EndInit(ctx, m.name))
	b := acquireRetry(t, r, m.name, gpu)
	defer b.Release()
	s, err := r.node.Stream(m.name)
	must(t, err)
	dctx, err := r.node.Context(m.name, b.GPU())
	must(t, err)
	mod, err := dctx.LoadModule(kernels.PTX())
	must(t, err)
	defer mod.Unload()
	linear, err := mod.Function("linear")
	must(t, err)
	relu, err := mod.Function("relu")
	must(t, err)
	var bufs []device.Ptr
	for _, n := range []int{mlpIn, mlpHidden, mlpOut} {
		p, err := r.node.Alloc(ctx, m.name, uint64(4*n))
		must(t, err)
		bufs = append(bufs, p)
	}
	defer func() {
		for _, p := range bufs {
			must(t, r.node.Free(m.name, p))
		}
	}()
	must(t, s.CopyHtoD(bufs[0], f32(mlpInput())))
	dims := []int{mlpIn, mlpHidden, mlpOut}
	for l := range 2 {
		k, n := dims[l], dims[l+1]
		args, err := device.PackArgs(linear.Params(), bufs[l], m.layers[l].w, m.layers[l].b, bufs[l+1], uint32(1),
			uint32(n), uint32(k))
		must(t, err)
		must(t, s.Launch(linear, device.Dim3{X: uint32((n + 15) / 16), Y: 1, Z: 1}, device.Dim3{X: 16, Y: 16, Z: 1}, 0,
			args))
		if l == 0 {
			args, err := device.PackArgs(relu.Params(), bufs[1], bufs[1], uint32(n))
			must(t, err)
			must(t, s.Launch(relu, device.Dim3{X: uint32((n + 255) / 256), Y: 1, Z: 1}, device.Dim3{X: 256, Y: 1, Z: 1},
				0, args))
		}
	}
	out := make([]byte, 4*mlpOut)
	must(t, s.CopyDtoH(out, bufs[2]))
	must(t, s.Synchronize(ctx))
	if err := b.Err(); err != nil {
		t.Fatalf("%s on gpu %d: binding broke: %v", m.name, gpu, err)
	}
	return out
}

// TestRotationThroughTooLittleMemoryKeepsEveryAnswer rotates six models through four GPUs that hold one model
// each: their initialisations interleave (each step bound on its own, as calls outside a request are), so that
// functions are evicted and moved between GPUs while they are still initialising, and then every function answers
// rounds of requests on GPUs chosen so that its model comes back both from the host image (PCIe) and from another
// GPU's copy (NVLink). Every answer must equal the function's first answer and the host's reference. Functions of
// two tenants share the GPUs, so a GPU also changes hands between tenants.
func TestRotationThroughTooLittleMemoryKeepsEveryAnswer(t *testing.T) {
	// 5 chunks of 2 MiB per GPU: a model takes 3 (W1, W2, and the biases' shared segment), its scratch 1.
	r := newRig(t, 10<<20, sim.Options{}, true)
	const functions, gpus = 6, 4
	mlps := make([]*mlp2, functions)
	for i := range mlps {
		mlps[i] = &mlp2{name: fmt.Sprintf("mlp%d", i), seed: i + 1}
		must(t, r.node.Register(mlps[i].name))
		must(t, r.node.SetTenant(context.Background(), mlps[i].name, fmt.Sprintf("namespace/t%d", i%2)))
	}
	// Initialisation: layer 0 of every function, then layer 1 on the next GPU (a move of a function that has not
	// finished its initialisation); six functions on four GPUs evict each other on the way.
	for l := range 2 {
		for i, m := range mlps {
			m.initLayer(t, r, (i+l)%gpus, l)
		}
	}
	first := make([][]byte, functions)
	paths := map[string]int{}
	for round := range 4 {
		for i, m := range mlps {
			gpu := (i*3 + round) % gpus
			gpusWith, active, err := r.node.Resident(m.name)
			must(t, err)
			path := "pcie"
			switch {
			case active == gpu:
				path = "none"
			case len(gpusWith) > 0 && (len(gpusWith) > 1 || gpusWith[0] != gpu):
				path = "nvlink"
			}
			for _, g := range gpusWith {
				if g == gpu && path != "none" {
					path = "parked"
				}
			}
			paths[path]++
			got := m.request(t, r, gpu)
			if round == 0 {
				first[i] = got
				if want := m.reference(); !bytes.Equal(got, want) {
					t.Fatalf("%s: first answer on gpu %d differs from the reference (%d of %d values zero)", m.name,
						gpu, zeros(got), mlpOut)
				}
				continue
			}
			if !bytes.Equal(got, first[i]) {
				t.Fatalf("%s: round %d on gpu %d (%s): the answer differs from its first (%d of %d values zero)",
					m.name, round, gpu, path, zeros(got), mlpOut)
			}
		}
	}
	if paths["pcie"] == 0 || paths["nvlink"] == 0 {
		t.Fatalf("swap paths taken %v: the rotation must come back both from the host and from another GPU", paths)
	}
	t.Logf("requests by how the model reached the gpu: %v", paths)
}

func zeros(b []byte) int {
	n := 0
	for i := 0; i+4 <= len(b); i += 4 {
		if binary.LittleEndian.Uint32(b[i:]) == 0 {
			n++
		}
	}
	return n
}
