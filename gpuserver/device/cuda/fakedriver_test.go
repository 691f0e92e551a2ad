package cuda_test

import (
	"context"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda"
	"github.com/faas-gpu/faas-gpu/gpuserver/memory"
)

// Counters of testdata/fakedriver.c, in its order (enum counter).
const (
	cModuleGetFunction = iota
	cFuncGetParamInfo
	cLaunch
	cMemMap
	cMemSetAccess
	cMemCreate
	cStreamSynchronize
	cStreamQuery
	cEventSynchronize
	cMemUnmap
	cCount
)

// fake is the cuda backend on testdata/fakedriver.c (one per test binary: the driver library is loaded once).
var fake struct {
	once     sync.Once
	b        *cuda.Backend
	counters string
	err      error
}

// openFake opens the backend on the fake driver, building it with cc; it skips where the real driver is tested
// (the process can load one driver only) or no C compiler is found.
func openFake(t *testing.T) *cuda.Backend {
	t.Helper()
	if os.Getenv("FAAS_GPU_TEST_CUDA") == "1" {
		t.Skip("the real driver is tested in this run (FAAS_GPU_TEST_CUDA=1); a process loads one driver only")
	}
	fake.once.Do(func() {
		cc, err := exec.LookPath("cc")
		if err != nil {
			fake.err = err
			return
		}
		dir, err := os.MkdirTemp("", "fake-cuda-")
		if err != nil {
			fake.err = err
			return
		}
		lib := filepath.Join(dir, "libcuda.so.1")
		if out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", lib, "testdata/fakedriver.c").CombinedOutput(); err != nil {
			fake.err = err
			t.Logf("%s", out)
			return
		}
		fake.counters = filepath.Join(dir, "counters")
		if err := os.Setenv("FAKE_CUDA_COUNTERS", fake.counters); err != nil {
			fake.err = err
			return
		}
		fake.b, fake.err = cuda.Open(lib)
	})
	if fake.err != nil {
		t.Skipf("the fake driver: %v", fake.err)
	}
	return fake.b
}

// counts reads the fake driver's counters.
func counts(t *testing.T) [cCount]uint64 {
	t.Helper()
	b, err := os.ReadFile(fake.counters)
	if err != nil || len(b) < 8*cCount {
		t.Fatalf("fake driver counters: %v (%d bytes)", err, len(b))
	}
	var c [cCount]uint64
	for i := range c {
		c[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return c
}

// A kernel is resolved once per module (cuModuleGetFunction and its parameter layout): launching it a hundred
// times, looking it up before each launch as the remoting server does, asks the driver no more.
func TestFakeDriverResolvesAKernelOnce(t *testing.T) {
	b := openFake(t)
	for _, ctxOwn := range []bool{false, true} {
		var mod device.Module
		var s device.Stream
		var err error
		if ctxOwn {
			dc, err := b.NewContext(0)
			must(t, err)
			defer dc.Destroy()
			mod, err = dc.LoadModule([]byte("fake image"))
			must(t, err)
			s, err = dc.NewStream()
			must(t, err)
		} else {
			mod, err = b.LoadModule(0, []byte("fake image"))
			must(t, err)
			s, err = b.NewStream(0)
			must(t, err)
		}
		before := counts(t)
		for range 100 {
			f, err := mod.Function("k")
			must(t, err)
			must(t, s.Launch(f, device.Dim3{X: 1}, device.Dim3{X: 32}, 0, make([]byte, 8)))
		}
		must(t, s.Synchronize(context.Background()))
		after := counts(t)
		if n := after[cLaunch] - before[cLaunch]; n != 100 {
			t.Fatalf("own context %v: %d launches reached the driver, want 100", ctxOwn, n)
		}
		if n := after[cModuleGetFunction] - before[cModuleGetFunction]; n != 1 {
			t.Errorf("own context %v: cuModuleGetFunction called %d times for 100 launches of one kernel, want 1",
				ctxOwn, n)
		}
		if n := after[cFuncGetParamInfo] - before[cFuncGetParamInfo]; n > 2 {
			t.Errorf("own context %v: cuFuncGetParamInfo called %d times for a one-parameter kernel, want at most 2",
				ctxOwn, n)
		}
		// another module of the same image resolves its own kernel
		other, err := b.LoadModule(0, []byte("fake image"))
		must(t, err)
		if _, err := other.Function("k"); err != nil {
			t.Fatal(err)
		}
		if n := counts(t)[cModuleGetFunction] - after[cModuleGetFunction]; n != 1 {
			t.Errorf("a second module's kernel: %d cuModuleGetFunction calls, want 1", n)
		}
		must(t, s.Destroy())
	}
}

// A synchronize on a cancellable context blocks in the driver's cuStreamSynchronize after a short poll: the fake
// driver completes a stream's work only then (a wait that polled between timers would never return).
func TestFakeDriverSynchronizeBlocksInTheDriver(t *testing.T) {
	b := openFake(t)
	mod, err := b.LoadModule(0, []byte("fake image"))
	must(t, err)
	f, err := mod.Function("k")
	must(t, err)
	s, err := b.NewStream(0)
	must(t, err)
	defer s.Destroy()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	before := counts(t)
	must(t, s.Launch(f, device.Dim3{X: 1}, device.Dim3{X: 32}, 0, make([]byte, 8)))
	if err := s.Synchronize(ctx); err != nil {
		t.Fatalf("synchronize: %v", err)
	}
	after := counts(t)
	if after[cStreamSynchronize] == before[cStreamSynchronize] {
		t.Fatal("the synchronize returned without the driver's cuStreamSynchronize")
	}
	if after[cStreamQuery] == before[cStreamQuery] {
		t.Error("the synchronize blocked without polling first")
	}
}

// A segment of many chunks (1 GiB of 2 MiB chunks) is mapped chunk by chunk but made accessible in one call.
func TestFakeDriverGrantsAccessOncePerRange(t *testing.T) {
	b := openFake(t)
	const chunk, n = 2 << 20, 512
	ptr, err := b.ReserveAddress(chunk*n, 0)
	must(t, err)
	var phys []device.Physical
	for range n {
		p, err := b.CreatePhysical(0, chunk)
		must(t, err)
		phys = append(phys, p)
	}
	before := counts(t)
	for i, p := range phys {
		must(t, b.Map(ptr+device.Ptr(i*chunk), p))
	}
	must(t, b.SetAccess(ptr, chunk*n, []int{0}))
	after := counts(t)
	if m := after[cMemMap] - before[cMemMap]; m != n {
		t.Errorf("%d cuMemMap calls for %d chunks", m, n)
	}
	if a := after[cMemSetAccess] - before[cMemSetAccess]; a != 1 {
		t.Errorf("%d cuMemSetAccess calls for one range of %d mappings, want 1", a, n)
	}
	must(t, b.Unmap(ptr, chunk*n))
	for _, p := range phys {
		must(t, p.Release())
	}
	must(t, b.FreeAddress(ptr, chunk*n))
}

// The pool's chunks carved out of 64 MiB allocations: mapping 1 GiB of them takes 16 cuMemMap calls and one
// cuMemSetAccess (it took 512 of each with an allocation per chunk).
func TestFakeDriverMapsAGiBOfSlabChunksInFewCalls(t *testing.T) {
	b := openFake(t)
	ctx := context.Background()
	m, err := memory.New(b, memory.Config{Share: 1, MaxBytesPerGPU: 2 << 30, SlabChunks: memory.DefaultSlabChunks})
	must(t, err)
	defer m.Close(ctx)
	const chunk, n = 2 << 20, 512
	chunks, err := m.Pool(0).Get(n)
	must(t, err)
	ptr, err := b.ReserveAddress(chunk*n, 0)
	must(t, err)
	before := counts(t)
	must(t, m.MapAt(ptr, chunks, []int{0}))
	after := counts(t)
	if got := after[cMemMap] - before[cMemMap]; got != n/memory.DefaultSlabChunks {
		t.Errorf("%d cuMemMap calls for 1 GiB, want %d", got, n/memory.DefaultSlabChunks)
	}
	if got := after[cMemSetAccess] - before[cMemSetAccess]; got != 1 {
		t.Errorf("%d cuMemSetAccess calls for 1 GiB, want 1", got)
	}
	must(t, m.Unmap(ptr, chunk*n))
	if got := counts(t)[cMemUnmap] - after[cMemUnmap]; got != n/memory.DefaultSlabChunks {
		t.Errorf("%d cuMemUnmap calls for 1 GiB, want %d", got, n/memory.DefaultSlabChunks)
	}
	must(t, m.Pool(0).Put(chunks))
	must(t, b.FreeAddress(ptr, chunk*n))
}
