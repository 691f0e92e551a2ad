package tenant

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// TestEveryOperationHasItsHandler: the gpuserver answers every operation its executors send (handoff.Ops), and
// nothing else.
func TestEveryOperationHasItsHandler(t *testing.T) {
	if err := handoff.CheckHandlers(handoff.ToGPUServer, (&Plane{}).handlers(nil)); err != nil {
		t.Fatal(err)
	}
}
