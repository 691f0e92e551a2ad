package remoting

import (
	"fmt"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
)

// TestModuleAndKernelResults: what the shim reports for module images and kernels the device refuses.
func TestModuleAndKernelResults(t *testing.T) {
	for err, want := range map[error]Result{
		fmt.Errorf("sim: gpu 0: %w: compute capability 7.0", device.ErrNoBinaryForGPU): ResultNoBinaryForGPU,
		fmt.Errorf("sim: %w: not a cubin", device.ErrInvalidImage):                     ResultInvalidImage,
		fmt.Errorf("%w: sim: kernel k", sim.ErrKernelNotSimulated):                     ResultKernelNotSimulated,
		fmt.Errorf("sim: %w: gpu 0 cannot access gpu 1", device.ErrNotSupported):       ResultNotSupported,
	} {
		if got := result(err); got != want {
			t.Errorf("%v: %d, want %d", err, got, want)
		}
	}
}
