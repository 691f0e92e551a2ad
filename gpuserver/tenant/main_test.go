package tenant

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/tenantexec"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// This test binary is also the tenants' executor process (tenantexec.RunIfChild). Executor supervisors and their
// control sockets end with their plane.
func TestMain(m *testing.M) {
	tenantexec.RunIfChild()
	testkit.VerifyNoLeaks(m)
}
