package testkit_test

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

func TestEventuallySeesAConditionThatComesToHold(t *testing.T) {
	var n atomic.Int32
	testkit.Eventually(t, 10*time.Second, "the third look", func() bool { return n.Add(1) >= 3 })
	calls := 0
	testkit.EventuallyNil(t, 10*time.Second, "the second call", func() error {
		if calls++; calls < 2 {
			return errors.New("first")
		}
		return nil
	})
}

func TestBufferTakesConcurrentWrites(t *testing.T) {
	var b testkit.Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				_, _ = b.Write([]byte("x"))
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	if got := len(b.String()); got != 800 {
		t.Fatalf("%d bytes, want 800", got)
	}
}

// A Python process answers line by line; its end is seen, with what it wrote to stderr.
func TestPythonDrivenLineByLine(t *testing.T) {
	py := testkit.StartPython(t, `
import os, sys
print("ready " + os.environ["X"], flush=True)
for line in sys.stdin:
    if line.strip() == "quit":
        print("bye", file=sys.stderr, flush=True)
        sys.exit(3)
    print(line.strip().upper(), flush=True)
`, "X=1")
	if l := py.Next(); l != "ready 1" {
		t.Fatalf("said %q", l)
	}
	for _, w := range []string{"a", "bc"} {
		if err := py.Send(w); err != nil {
			t.Fatal(err)
		}
		if l, err := py.LineWithin(30 * time.Second); err != nil || l != strings.ToUpper(w) {
			t.Fatalf("%s: %q %v", w, l, err)
		}
	}
	_ = py.Send("quit")
	if _, err := py.LineWithin(30 * time.Second); !errors.Is(err, testkit.ErrEnded) {
		t.Fatalf("after quit: %v, want ErrEnded", err)
	}
	testkit.Eventually(t, 10*time.Second, "its stderr", func() bool { return strings.Contains(py.Stderr(), "bye") })
}
