package testkit

import (
	"errors"
	"testing"
	"time"
)

// pollFirst and pollMax bound the wait between two looks at a condition: the first look comes at once, then the
// wait doubles up to pollMax, so a condition that holds soon is seen soon and one that takes seconds costs little.
const (
	pollFirst = time.Millisecond
	pollMax   = 50 * time.Millisecond
)

// Eventually polls cond until it holds; when timeout passes first, it fails the test with what (which should say
// what was awaited). Timeouts are generous: the CI machine has two cores that many tests share.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !until(timeout, func() error {
		if cond() {
			return nil
		}
		return errors.New("not yet")
	}) {
		t.Fatalf("%s: not within %s", what, timeout)
	}
}

// EventuallyNil polls f until it returns nil; when timeout passes first, it fails the test with what and f's last
// error.
func EventuallyNil(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	var last error
	if !until(timeout, func() error { last = f(); return last }) {
		t.Fatalf("%s: not within %s: %v", what, timeout, last)
	}
}

// EventuallyNilEvery is EventuallyNil looking every interval: for conditions that cost a round trip to a live
// cluster.
func EventuallyNilEvery(t testing.TB, timeout, every time.Duration, what string, f func() error) {
	t.Helper()
	var last error
	if !poll(timeout, every, every, func() error { last = f(); return last }) {
		t.Fatalf("%s: not within %s: %v", what, timeout, last)
	}
}

// until calls f until it returns nil (true) or timeout passes (false).
func until(timeout time.Duration, f func() error) bool { return poll(timeout, pollFirst, pollMax, f) }

// poll calls f until it returns nil (true) or timeout passes (false), waiting first, then doubling up to most.
func poll(timeout, first, most time.Duration, f func() error) bool {
	deadline := time.Now().Add(timeout)
	for wait := first; ; wait = min(2*wait, most) {
		if f() == nil {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
	}
}
