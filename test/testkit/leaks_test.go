package testkit

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// leakChild makes this test binary a package whose test leaks a goroutine, checked with a short wait.
const leakChild = "FAAS_GPU_TESTKIT_LEAK_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(leakChild) == "1" {
		os.Exit(verifyNoLeaks(m, 200*time.Millisecond))
	}
	VerifyNoLeaks(m)
}

// TestLeakingTest is the child's test: it starts a goroutine nothing stops.
func TestLeakingTest(t *testing.T) {
	if os.Getenv(leakChild) != "1" {
		t.Skip("run by TestVerifyNoLeaksFailsALeakingPackage in a child process")
	}
	block := make(chan struct{})
	go func() { <-block }()
}

// TestVerifyNoLeaksFailsALeakingPackage: a package whose tests pass but leave a goroutine running exits 1, naming
// the goroutine's function.
func TestVerifyNoLeaksFailsALeakingPackage(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestLeakingTest$")
	cmd.Env = append(os.Environ(), leakChild+"=1")
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), "TestLeakingTest") {
		t.Fatalf("a package leaking a goroutine: exit %d (%v), want 1 naming the goroutine\n%s", code, err, out)
	}
}
