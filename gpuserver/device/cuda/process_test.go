package cuda_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Probes run in child processes of the test binary (another tenant's executor, as far as the driver can tell):
// TestCUDAProbe does what FAAS_GPU_CUDA_PROBE says and prints "probe: <result>".
const probeEnv = "FAAS_GPU_CUDA_PROBE"

// probe runs kind at addr in a child process and returns its result: "fault", or "read <value>".
func probe(t *testing.T, kind string, addr device.Ptr, files ...*os.File) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCUDAProbe$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%d", probeEnv, kind, uint64(addr)))
	cmd.ExtraFiles = files
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	for _, l := range strings.Split(string(out), "\n") {
		if r, ok := strings.CutPrefix(strings.TrimSpace(l), "probe: "); ok {
			return r
		}
	}
	t.Fatalf("probe %s at %#x: no result (%v)\n%s\n%s", kind, uint64(addr), err, out, stderr.String())
	return ""
}

// TestCUDAProbe is the child of probe; it skips unless started by it.
func TestCUDAProbe(t *testing.T) {
	spec := os.Getenv(probeEnv)
	if spec == "" {
		t.Skip("a child of TestCUDAContextsIsolate and TestCUDAShareableChunksCrossProcesses")
	}
	kind, a, _ := strings.Cut(spec, ":")
	addr, _ := strconv.ParseUint(a, 10, 64)
	b := openCUDA(t)
	ctx := context.Background()
	switch kind {
	case "read", "own-heap":
		if kind == "own-heap" {
			heap := make([]byte, 1<<20)
			addr = uint64(uintptr(unsafe.Pointer(&heap[0])))
			defer func() { _ = heap[0] }()
		}
		out := mapOn(t, b, 0, b.GPUs()[0].Granularity)
		c, err := b.NewContext(0)
		must(t, err)
		if err := addIn(t, c, device.Ptr(addr), device.Ptr(addr), out, 256); err != nil {
			if device.IsContextFault(err) {
				fmt.Println("probe: fault")
				return
			}
			fmt.Printf("probe: error %v\n", err)
			return
		}
		fmt.Println("probe: read")
	case "import":
		// fd 3: a chunk another process exported; it holds 0xA5 bytes; this process writes 0x5A over its first KiB.
		f := os.NewFile(3, "chunk")
		size := b.GPUs()[0].Granularity
		t0 := time.Now()
		ph, err := b.ImportPhysical(0, size, f)
		must(t, err)
		took := time.Since(t0)
		p, err := b.ReserveAddress(size, 0)
		must(t, err)
		must(t, b.Map(p, ph))
		must(t, b.SetAccess(p, size, []int{0}))
		s, err := b.NewStream(0)
		must(t, err)
		got := make([]byte, 1024)
		must(t, s.CopyDtoH(got, p))
		must(t, s.Memset8(p, 0x5A, 1024))
		must(t, s.Synchronize(ctx))
		must(t, b.Unmap(p, size))
		must(t, ph.Release())
		if !bytes.Equal(got, bytes.Repeat([]byte{0xA5}, 1024)) {
			fmt.Printf("probe: read other bytes %x\n", got[:8])
			return
		}
		fmt.Printf("probe: imported in %v\n", took)
	case "context":
		// Hold a process's contexts (the primary on every GPU, one more on GPU 0) until stdin closes.
		c, err := b.NewContext(0)
		must(t, err)
		defer c.Destroy()
		fmt.Println("probe: holding")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	}
}

// TestCUDAShareableChunksCrossProcesses: the gpuserver's chunk lending on the real driver (docs/tenants.md): a chunk
// created shareable is exported as a POSIX file descriptor, imported by another process (a tenant's executor),
// mapped there at an address of its own, read (the exporter's bytes) and written (the exporter reads them back).
func TestCUDAShareableChunksCrossProcesses(t *testing.T) {
	b := openCUDA(t)
	if err := b.EnableSharing(); err != nil {
		t.Fatalf("the GPU cannot share memory by file descriptor: %v", err)
	}
	ctx := context.Background()
	size := b.GPUs()[0].Granularity
	ph, err := b.CreatePhysical(0, size)
	must(t, err)
	defer ph.Release()
	p, err := b.ReserveAddress(size, 0)
	must(t, err)
	must(t, b.Map(p, ph))
	must(t, b.SetAccess(p, size, []int{0}))
	s, err := b.NewStream(0)
	must(t, err)
	must(t, s.Memset8(p, 0xA5, size))
	must(t, s.Synchronize(ctx))
	f, err := b.ExportPhysical(ph)
	must(t, err)
	res := probe(t, "import", 0, f)
	f.Close()
	if !strings.HasPrefix(res, "imported") {
		t.Fatalf("the importing process: %s", res)
	}
	got := make([]byte, 1024)
	must(t, s.CopyDtoH(got, p))
	must(t, s.Synchronize(ctx))
	if !bytes.Equal(got, bytes.Repeat([]byte{0x5A}, 1024)) {
		t.Fatalf("the exporter reads %x after the importer wrote 0x5A", got[:8])
	}
	report(t, "Chunk import (cuMemImportFromShareableHandle of one %d MiB chunk): %s", size>>20,
		strings.TrimPrefix(res, "imported in "))
}

// TestCUDAContextMemory measures what a tenant's executor costs in GPU memory: a context created in this process
// (a tenant context), and a whole other process holding the primary contexts and a tenant context (an executor).
// The gpuserver leaves --tenant-context-bytes per executor free (docs/tenants.md); this figure says how much that
// must be.
func TestCUDAContextMemory(t *testing.T) {
	b := openCUDA(t)
	free0, total, err := b.MemoryInfo(0)
	must(t, err)
	c, err := b.NewContext(0)
	must(t, err)
	free1, _, err := b.MemoryInfo(0)
	must(t, err)
	must(t, c.Destroy())
	base, _, err := b.MemoryInfo(0)
	must(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCUDAProbe$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), probeEnv+"=context:0")
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	must(t, cmd.Start())
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.Contains(sc.Text(), "probe: holding") {
	}
	free2, _, err := b.MemoryInfo(0)
	must(t, err)
	_ = in.Close()
	_ = cmd.Wait()
	mib := func(v uint64) float64 { return float64(v) / (1 << 20) }
	report(t, "GPU memory of a tenant context (cuCtxCreate in a process that has its primary context): %.0f MiB; of "+
		"an executor process (its primary contexts and one tenant context, as seen on GPU 0): %.0f MiB; GPU 0 has "+
		"%.0f MiB", mib(free0-free1), mib(base-free2), mib(total))
}

// report logs a figure and appends it to $FAAS_GPU_TENANT_REPORT (the GPU suite writes docs/bench/tenants-cuda.md).
func report(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	if path := os.Getenv("FAAS_GPU_TENANT_REPORT"); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintf(f, "- %s: %s\n", t.Name(), line)
			f.Close()
		}
	}
}
