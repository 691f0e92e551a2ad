// Package sandbox runs a function's process the way a container runtime would, with the kernel's namespaces and
// no container runtime: its own mount namespace whose root holds only what the function needs (the system's
// read-only directories, its build context and Python environment read-only, its own secrets, a private /tmp and
// /dev/shm, the platform's Unix sockets as files it can connect to but not replace), its own PID namespace (it sees
// and signals only its own processes; /proc shows nothing else), its own IPC and UTS namespaces, no capabilities, no
// new privileges, and an environment made from scratch by the caller. The network namespace is shared, so a
// function still listens on a loopback port the gateway proxies to.
//
// Identity depends on who runs the platform:
//
//   - As root, every function runs as its own unprivileged user and group, taken from an id range (IDRange, by
//     default 65536 ids from DefaultFirstID) that no account of the machine uses; the functions are members of
//     one more group of that range, SocketGroup, which may connect to the platform's sockets.
//   - As any other user, the kernel lets a process map only its own id into a user namespace, so every function
//     runs as "root" of a user namespace of its own, without any capability, which is the platform's user outside.
//     Namespaces keep functions apart from each other and from the platform; their ids do not.
//
// A sandboxed process is this very binary started again as the sandbox's init (argv[0] InitName), which builds the
// namespaces' contents, drops every privilege, starts the function as its only child, forwards signals to it,
// reaps orphans and exits with the function's status. A program that uses the package must therefore call
// IsInit/RunInit first thing in main (and in TestMain of a test binary that sandboxes), before anything else runs.
//
// What crosses from the platform into the init is one record, Spec, as JSON in an anonymous file on descriptor 3.
package sandbox

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// Mode says whether functions must be isolated.
type Mode string

const (
	// ModeAuto isolates functions where the kernel allows it and runs them unisolated, with a loud warning that
	// says why and what that exposes, where it does not.
	ModeAuto Mode = "auto"
	// ModeRequired refuses to start (ErrUnavailable) where functions cannot be isolated.
	ModeRequired Mode = "required"
	// ModeOff runs functions as plain child processes of the platform: same user, same view of the machine.
	ModeOff Mode = "off"
)

// ParseMode reads a Mode; the error names the accepted values.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.TrimSpace(s)); m {
	case ModeAuto, ModeRequired, ModeOff:
		return m, nil
	}
	return "", fmt.Errorf("%q: want auto, required or off", s)
}

// ErrUnavailable is returned (wrapped, with the kernel's reason) by New with ModeRequired where functions cannot
// be isolated.
var ErrUnavailable = errors.New("function isolation is unavailable")

// IDRange is the user and group ids functions run as when the platform runs as root: First is SocketGroup (the
// group every function is a member of, which may connect to the platform's sockets), First+1 .. First+Count-1 are
// the functions' own user and group ids.
type IDRange struct {
	First, Count uint32
}

// Defaults of IDRange: far above the ids of accounts, system users and the usual subordinate ranges (100000+).
const (
	DefaultFirstID = 1_800_000_000
	DefaultIDCount = 65536
)

// ParseIDRange reads "FIRST:COUNT".
func ParseIDRange(s string) (IDRange, error) {
	var r IDRange
	first, count, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		return r, fmt.Errorf("%q: want FIRST:COUNT, e.g. %d:%d", s, DefaultFirstID, DefaultIDCount)
	}
	if _, err := fmt.Sscan(first, &r.First); err != nil {
		return r, fmt.Errorf("%q: first id: %w", s, err)
	}
	if _, err := fmt.Sscan(count, &r.Count); err != nil {
		return r, fmt.Errorf("%q: count: %w", s, err)
	}
	return r, r.validate()
}

func (r IDRange) String() string { return fmt.Sprintf("%d:%d", r.First, r.Count) }

func (r IDRange) validate() error {
	switch {
	case r.Count < 2:
		return fmt.Errorf("id range %s: want a count of at least 2 (the socket group and one function)", r)
	case r.First == 0:
		return fmt.Errorf("id range %s: must not start at 0 (root)", r)
	case uint64(r.First)+uint64(r.Count) > 1<<32-2: // 4294967295 is (uid_t)-1, "no id"
		return fmt.Errorf("id range %s: ends beyond the largest id 4294967294", r)
	}
	return nil
}

// Config configures a Sandbox.
type Config struct {
	// Mode: ModeAuto when empty.
	Mode Mode
	// IDs are the ids of functions when the platform runs as root; DefaultFirstID:DefaultIDCount when zero.
	IDs IDRange
	// TmpBytes bounds the function's /tmp and its /dev/shm, each (tmpfs, counted against the machine's memory);
	// DefaultTmpBytes when 0.
	TmpBytes int64
}

// DefaultTmpBytes is the size of a sandboxed function's /tmp and of its /dev/shm.
const DefaultTmpBytes = 256 << 20

// Report says what a Sandbox isolates, for the platform's start-up line and status.
type Report struct {
	// Mode is the configured mode.
	Mode Mode
	// Isolated is set when functions run in namespaces of their own.
	Isolated bool
	// Namespaces lists the namespaces each function gets (user, mount, pid, ipc, uts).
	Namespaces []string
	// PerFunctionIDs is set when every function has a user and group id of its own (the platform runs as root).
	PerFunctionIDs bool
	// IDs describes the ids functions run as.
	IDs string
	// Exposed lists what is not isolated, in a few words each.
	Exposed []string
	// Reason says why functions are not isolated (mode off, or the kernel's refusal).
	Reason string
}

// Summary is the report in one line.
func (r Report) Summary() string {
	if !r.Isolated {
		return fmt.Sprintf("NOT ISOLATED (%s): functions run as this process's user and see what it sees; exposed: %s",
			r.Reason, strings.Join(r.Exposed, "; "))
	}
	return fmt.Sprintf("isolated: %s namespaces; %s; shared: %s", strings.Join(r.Namespaces, ", "), r.IDs,
		strings.Join(r.Exposed, "; "))
}

// Identity is who one function's processes run as, outside their namespaces.
type Identity struct {
	UID, GID uint32
	// Groups are supplementary groups (SocketGroup when the platform runs as root).
	Groups []uint32
}

// Spec is one sandboxed process: what its init builds and runs. Paths are absolute and appear at the same place
// inside the sandbox as outside.
type Spec struct {
	// Argv is the program and its arguments; Argv[0] is an absolute path visible inside (in ReadOnly).
	Argv []string
	// Env is the whole environment of the program.
	Env []string
	// Dir is the working directory, inside one of ReadOnly.
	Dir string
	// Root is an empty directory the sandbox's root file system is mounted on (in its own mount namespace: the
	// directory stays empty for everyone else). It must not be inside a path the sandbox shows.
	Root string
	// Hostname is the UTS name inside.
	Hostname string
	// ReadOnly are files and directories shown read-only (system directories, the build context, the Python
	// environment, the function's secrets).
	ReadOnly []string
	// Folders are paths of ReadOnly that must be folders themselves (a function's build context): each is bound
	// from a descriptor opened without following a link, so that one swapped for a link after the platform checked
	// it (to another function's files, say) is refused, not followed. Other ReadOnly paths that are links (/lib on
	// a merged-/usr system) are followed.
	Folders []string
	// Writable are folders shown read-write (no set-id programs, no devices): an install's target and its
	// temporary folder. Each must exist and be a folder; one may lie inside a ReadOnly folder and the other way
	// round.
	Writable []string
	// Sockets are Unix socket files shown so that the process can connect to them but not remove, rename,
	// re-create, chmod or listen in their place.
	Sockets []string
	// TmpBytes bounds /tmp and /dev/shm.
	TmpBytes int64
	// UserNS: the sandbox has a user namespace of its own mapping root inside to ID.UID outside (the platform is
	// not root); otherwise the init runs as root and the program as ID.
	UserNS bool
	// ID is who the program runs as outside.
	ID Identity
	// Probe: build everything, drop privileges, check the result, and exit 0 without running Argv.
	Probe bool
}

// SystemPaths are what every sandbox shows read-only beside the function's own files: the system's programs and
// libraries, and the files of /etc that name resolution, TLS, time zones, the dynamic linker and Python read.
// Missing ones are left out by the init. /etc/passwd and /etc/group are written by the init: they name only the
// sandbox's own users.
func SystemPaths() []string {
	paths := []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
		"/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/gai.conf", "/etc/localtime",
		"/etc/timezone", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ssl", "/etc/pki",
		"/etc/ca-certificates", "/etc/ca-certificates.conf", "/etc/mime.types", "/etc/protocols", "/etc/services",
		"/etc/alternatives"}
	py, _ := filepath.Glob("/etc/python3*")
	return append(paths, py...)
}
