// Package testkit holds what the tests of many packages share: polling for a condition instead of sleeping
// (Eventually), a buffer a process writes while the test reads it (Buffer), a Python process driven line by line
// through the shim (Python), every descriptor of the process in use (ExhaustDescriptors), and the goroutine leak
// check of packages that start servers, sessions or workers (VerifyNoLeaks). It is imported by tests only.
package testkit
