package frontdoor_test

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// The front door starts no goroutine that outlives a request.
func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }
