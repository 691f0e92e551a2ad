package metering_test

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// The meter samples and saves its counters on a goroutine of its own: it ends when the meter is closed.
func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }
