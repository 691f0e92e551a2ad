package testkit

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// leakWait bounds how long the goroutines the tests started may take to end after the last test: those that end
// with their owner's Close (a connection's reader, a refusal's drain) may still be finishing on a loaded machine.
const leakWait = 30 * time.Second

// VerifyNoLeaks runs the package's tests and then fails them when a goroutine they started is still running
// leakWait later: in packages that start servers, sessions and workers, every goroutine has an owner that stops it.
// Call it from TestMain; ignore names goroutines of third-party code that outlive their owner by design.
func VerifyNoLeaks(m *testing.M, ignore ...goleak.Option) {
	os.Exit(verifyNoLeaks(m, leakWait, ignore...))
}

// verifyNoLeaks runs the tests and returns the exit code: 1 when a goroutine is still running wait after them.
func verifyNoLeaks(m *testing.M, wait time.Duration, ignore ...goleak.Option) int {
	code := m.Run()
	if code == 0 {
		var leaked error
		deadline := time.Now().Add(wait)
		for leaked = goleak.Find(ignore...); leaked != nil && time.Now().Before(deadline); leaked = goleak.Find(ignore...) {
			time.Sleep(50 * time.Millisecond)
		}
		if leaked != nil {
			fmt.Fprintf(os.Stderr, "goroutines the tests started are still running %s after them: %v\n", wait, leaked)
			code = 1
		}
	}
	return code
}
