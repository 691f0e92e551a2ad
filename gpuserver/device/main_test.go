package device_test

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// Wait blocks on the device on a goroutine of its own (once the spin is over): it ends when the device answers,
// even after the caller gave up.
func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }
