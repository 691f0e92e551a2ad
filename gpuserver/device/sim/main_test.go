package sim_test

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// The simulated node runs each stream's work on a goroutine of its own: every one ends when its node is closed.
func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }
