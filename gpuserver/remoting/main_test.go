package remoting

import (
	"testing"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// Sessions, their pollers and the listener end with their server.
func TestMain(m *testing.M) { testkit.VerifyNoLeaks(m) }
