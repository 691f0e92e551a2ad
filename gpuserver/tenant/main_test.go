package tenant

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// Executor supervisors and their control sockets end with their plane.
func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }
