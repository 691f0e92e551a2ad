package tenantexec

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/tenant/handoff"
)

// TestEveryOperationHasItsHandler: the executor answers every operation the gpuserver sends (handoff.Ops), and
// nothing else.
func TestEveryOperationHasItsHandler(t *testing.T) {
	if err := handoff.CheckHandlers(handoff.ToExecutor, (&process{}).handlers()); err != nil {
		t.Fatal(err)
	}
}
