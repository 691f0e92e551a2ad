package testkit

import (
	"testing"

	"go.uber.org/goleak"
)

// VerifyNoLeaks runs the package's tests and then fails them when a goroutine they started is still running: in
// packages that start servers, sessions and workers, every goroutine has an owner that stops it. Call it from
// TestMain; ignore names goroutines of third-party code that outlive their owner by design.
func VerifyNoLeaks(m *testing.M, ignore ...goleak.Option) {
	goleak.VerifyTestMain(m, ignore...)
}
