package local

import "syscall"

// childAttrs gives a child its own process group (so a stop signal reaches everything it started) and SIGKILL as
// its parent-death signal.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
