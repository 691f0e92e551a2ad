package executor_test

import (
	"context"
	"errors"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/executor"
)

// TestDeviceErrorAtSynchronizeMarksTheGPUUnhealthy fails a simulated GPU under a function's running request: the
// error surfaces at the request's synchronisation, the GPU is taken out of service, the request's binding reports
// it broke, and the function's next request runs on another GPU from its host image with the same bytes.
func TestDeviceErrorAtSynchronizeMarksTheGPUUnhealthy(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, 64<<20, sim.Options{}, false)
	m := initModel(t, r, "bert", 1, 3<<20, 4096)
	b, err := r.node.Acquire(ctx, "bert", 1, executor.Any)
	must(t, err)
	s, err := r.node.Stream("bert")
	must(t, err)
	ecc := errors.New("uncorrectable ECC error")
	must(t, r.dev.(*sim.Backend).FailGPU(1, ecc))
	must(t, s.Memset8(m.blocks[0], 0, 16)) // asynchronous: the failure shows at the synchronisation
	err = s.Synchronize(ctx)
	if !errors.Is(err, executor.ErrUnhealthy) || !errors.Is(err, ecc) {
		t.Fatalf("synchronize on the failed gpu: %v, want ErrUnhealthy wrapping the device error", err)
	}
	if r.node.Healthy(1) {
		t.Fatal("gpu 1 still healthy after a device error")
	}
	if err := b.Err(); !errors.Is(err, executor.ErrUnhealthy) {
		t.Fatalf("binding on the failed gpu: Err() = %v", err)
	}
	if err := s.CopyHtoD(m.blocks[0], m.data[0]); !errors.Is(err, executor.ErrUnhealthy) {
		t.Fatalf("work on the failed gpu after the failure: %v, want ErrUnhealthy", err)
	}
	b.Release()

	b2, err := r.node.Acquire(ctx, "bert", -1, executor.Any)
	must(t, err)
	defer b2.Release()
	if b2.GPU() == 1 {
		t.Fatal("the next request was bound to the failed gpu")
	}
	if err := b2.Err(); err != nil {
		t.Fatalf("binding on a healthy gpu: %v", err)
	}
	verify(t, r, m, b2.GPU())
	if st := r.node.Status()[1]; st.Healthy || st.Error == "" {
		t.Fatalf("status of the failed gpu: %+v", st)
	}
}
