package connlimit_test

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// A refused connection is answered and drained on a goroutine of its own (Refuser.Refuse): each ends with its
// connection, within the refusal's bound.
func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }
