//go:build !linux

package local

import "syscall"

// childAttrs gives a child its own process group. Outside Linux there is no parent-death signal: children are
// stopped by Close only.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
