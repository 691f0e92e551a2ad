package remoting

import (
	"bytes"
	"os"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim/kernels"
)

// TestFunctionPTXMatchesReferenceKernels keeps the example functions' checked-in PTX equal to the sim's.
func TestFunctionPTXMatchesReferenceKernels(t *testing.T) {
	for _, fn := range []string{"vector-add", "mlp"} {
		b, err := os.ReadFile("../../functions/" + fn + "/kernels.ptx")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, kernels.PTX()) {
			t.Errorf("functions/%s/kernels.ptx differs from gpuserver/device/sim/kernels/kernels.ptx: copy it", fn)
		}
	}
}
