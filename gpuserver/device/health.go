package device

import (
	"context"
	"errors"
	"fmt"
)

// ErrCheckFailed: a GPU failed its health check (CheckHealth): it is not fit for service.
var ErrCheckFailed = errors.New("gpu health check failed")

// healthCheckBytes is how much memory CheckHealth writes and reads back.
const healthCheckBytes = 4096

// CheckHealth checks that GPU gpu of b does work: in a fresh context of its own (cuCtxCreate on the cuda backend,
// never one a tenant's kernel could have poisoned) it maps one granule of new physical memory, sets 4 KiB of it
// on a stream, copies it back, waits for the stream and compares the bytes. It answers nil when the GPU did all of
// it, else an error wrapping ErrCheckFailed and the driver's own. The sim answers from its own device state (a
// GPU failed by FailGPU fails its streams' work); the cuda backend runs the same calls on the real driver, so the
// check builds and runs without a GPU. Callers run it in a process whose contexts no tenant's kernel ran in (the
// gpuserver), after a tenant's fault and before they trust the GPU again.
func CheckHealth(ctx context.Context, b Backend, gpu int) (err error) {
	fail := func(step string, cause error) error {
		return fmt.Errorf("%w: gpu %d: %s: %w", ErrCheckFailed, gpu, step, cause)
	}
	gpus := b.GPUs()
	if gpu < 0 || gpu >= len(gpus) {
		return fmt.Errorf("%w: gpu %d (the node has %d)", ErrInvalidValue, gpu, len(gpus))
	}
	size := gpus[gpu].Granularity
	if size == 0 {
		return fail("granularity", fmt.Errorf("%w: the GPU reports none", ErrInvalidValue))
	}
	c, err := b.NewContext(gpu)
	if err != nil {
		return fail("create a context", err)
	}
	defer func() {
		if derr := c.Destroy(); derr != nil && err == nil {
			err = fail("destroy its context", derr)
		}
	}()
	ptr, err := b.ReserveAddress(size, 0)
	if err != nil {
		return fail("reserve an address", err)
	}
	defer func() { _ = b.FreeAddress(ptr, size) }()
	phys, err := b.CreatePhysical(gpu, size)
	if err != nil {
		return fail("allocate memory", err)
	}
	defer func() { _ = phys.Release() }()
	if err := b.Map(ptr, phys); err != nil {
		return fail("map memory", err)
	}
	defer func() { _ = b.Unmap(ptr, size) }()
	if err := b.SetAccess(ptr, size, []int{gpu}); err != nil {
		return fail("grant access", err)
	}
	s, err := c.NewStream()
	if err != nil {
		return fail("create a stream", err)
	}
	defer func() { _ = s.Destroy() }()
	n := min(uint64(healthCheckBytes), size)
	back := make([]byte, n)
	const pattern = 0xa5
	if err := s.Memset8(ptr, pattern, n); err != nil {
		return fail("set memory", err)
	}
	if err := s.CopyDtoH(back, ptr); err != nil {
		return fail("read memory back", err)
	}
	if err := s.Synchronize(ctx); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("gpu %d health check: %w", gpu, ctx.Err())
		}
		return fail("synchronize", err)
	}
	for i, v := range back {
		if v != pattern {
			return fail("compare", fmt.Errorf("byte %d read back as %#x, set to %#x", i, v, pattern))
		}
	}
	return nil
}
