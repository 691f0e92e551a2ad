package handoff_test

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// A hand-off peer dispatches each frame to its handler on a goroutine of its own: each ends with its peer.
func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }
