//go:build !linux

package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
)

// InitName is argv[0] of a sandbox's init; outside Linux there is none.
const InitName = "faas-gpu-sandbox-init"

// Sandbox outside Linux never isolates: the kernel has no namespaces.
type Sandbox struct{ report Report }

// New reports that functions cannot be isolated; with ModeRequired it fails with ErrUnavailable.
func New(ctx context.Context, cfg Config) (*Sandbox, error) {
	if cfg.Mode == "" {
		cfg.Mode = ModeAuto
	}
	if _, err := ParseMode(string(cfg.Mode)); err != nil {
		return nil, fmt.Errorf("sandbox mode %w", err)
	}
	reason := "turned off"
	if cfg.Mode != ModeOff {
		reason = "namespaces are Linux only, this is " + runtime.GOOS
	}
	if cfg.Mode == ModeRequired {
		return nil, fmt.Errorf("%w: %s", ErrUnavailable, reason)
	}
	return &Sandbox{report: Report{Mode: cfg.Mode, Reason: reason, IDs: "the platform's own user",
		Exposed: []string{"everything the platform's user can reach"}}}, nil
}

// Report says what the sandbox isolates.
func (s *Sandbox) Report() Report { return s.report }

// Enabled is false outside Linux.
func (s *Sandbox) Enabled() bool { return false }

// SocketGroup is not ok outside Linux.
func (s *Sandbox) SocketGroup() (uint32, bool) { return 0, false }

// Identity is this process's user.
func (s *Sandbox) Identity(string) Identity {
	return Identity{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
}

// Borrow returns this process's user outside Linux.
func (s *Sandbox) Borrow(string) (Identity, func()) {
	return Identity{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}, func() {}
}

// Release does nothing outside Linux.
func (s *Sandbox) Release(string) {}

// TmpBytes is DefaultTmpBytes.
func (s *Sandbox) TmpBytes() int64 { return DefaultTmpBytes }

// UserNS is false outside Linux.
func (s *Sandbox) UserNS() bool { return false }

// Command fails outside Linux.
func (s *Sandbox) Command(Spec) (*exec.Cmd, func(), error) {
	return nil, nil, fmt.Errorf("sandbox: %w: %s", ErrUnavailable, s.report.Reason)
}

// IsInit is false outside Linux.
func IsInit() bool { return false }

// RunInit is never called outside Linux.
func RunInit() int { return 1 }
