package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// probeTimeout bounds the start-up probe (one process that builds a sandbox and exits).
const probeTimeout = 20 * time.Second

// Sandbox starts sandboxed processes. It is safe for concurrent use.
type Sandbox struct {
	cfg    Config
	report Report
	userNS bool // the unprivileged variant: a user namespace mapping root inside to this process's user

	mu   sync.Mutex
	ids  map[string]uint32 // function -> its uid (and gid), root only
	next uint32            // the next id to try, an offset from IDs.First+1
}

// New checks what the kernel allows by building one sandbox, and returns a Sandbox that isolates when that worked.
// With ModeRequired it fails with ErrUnavailable (and the kernel's reason) otherwise; with ModeAuto it returns a
// Sandbox whose Report says functions are not isolated and why.
func New(ctx context.Context, cfg Config) (*Sandbox, error) {
	if cfg.Mode == "" {
		cfg.Mode = ModeAuto
	}
	if _, err := ParseMode(string(cfg.Mode)); err != nil {
		return nil, fmt.Errorf("sandbox mode %w", err)
	}
	if cfg.IDs == (IDRange{}) {
		cfg.IDs = IDRange{First: DefaultFirstID, Count: DefaultIDCount}
	}
	if err := cfg.IDs.validate(); err != nil {
		return nil, err
	}
	if cfg.TmpBytes <= 0 {
		cfg.TmpBytes = DefaultTmpBytes
	}
	s := &Sandbox{cfg: cfg, ids: map[string]uint32{}}
	if cfg.Mode == ModeOff {
		s.report = unisolated(cfg.Mode, "turned off")
		return s, nil
	}
	var reasons []string
	variants := []bool{true} // the user-namespace variant
	if os.Geteuid() == 0 {
		variants = []bool{false, true} // as root, per-function ids first
	}
	for _, userNS := range variants {
		err := s.probe(ctx, userNS)
		if err == nil {
			s.userNS = userNS
			s.report = s.isolated()
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		reasons = append(reasons, err.Error())
	}
	reason := strings.Join(reasons, "; ") + hint()
	if cfg.Mode == ModeRequired {
		return nil, fmt.Errorf("%w: %s", ErrUnavailable, reason)
	}
	s.report = unisolated(cfg.Mode, reason)
	return s, nil
}

// hint names the kernel settings that forbid unprivileged user namespaces when one of them does.
func hint() string {
	var out []string
	for path, bad := range map[string]string{
		"/proc/sys/kernel/unprivileged_userns_clone":             "0",
		"/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "1",
		"/proc/sys/user/max_user_namespaces":                     "0",
	} {
		if raw, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(raw)) == bad {
			out = append(out, strings.ReplaceAll(strings.TrimPrefix(path, "/proc/sys/"), "/", ".")+"="+bad)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return " (the kernel forbids unprivileged user namespaces: " + strings.Join(out, ", ") + ")"
}

func unisolated(mode Mode, reason string) Report {
	return Report{Mode: mode, Reason: reason, IDs: "the platform's own user",
		Exposed: []string{"the platform's environment and files (its credentials and keys)",
			"every process of the user (/proc, signals)", "other functions' secrets and tokens",
			"the platform's sockets (a function can replace them)"}}
}

func (s *Sandbox) isolated() Report {
	r := Report{Mode: s.cfg.Mode, Isolated: true, Namespaces: []string{"mount", "pid", "ipc", "uts"},
		Exposed: []string{"the network namespace (loopback ports of the platform and of other functions)"}}
	if s.userNS {
		r.Namespaces = append([]string{"user"}, r.Namespaces...)
		r.IDs = fmt.Sprintf("every function is root without capabilities in a user namespace of its own, which is "+
			"uid %d outside (not root: no per-function ids)", os.Getuid())
		r.Exposed = append(r.Exposed, "one uid for every function and the platform (ids do not separate them; "+
			"namespaces do)")
	} else {
		r.PerFunctionIDs = true
		r.IDs = fmt.Sprintf("per-function uids and gids %d..%d, socket group %d", s.cfg.IDs.First+1,
			s.cfg.IDs.First+s.cfg.IDs.Count-1, s.cfg.IDs.First)
	}
	return r
}

// Report says what the sandbox isolates.
func (s *Sandbox) Report() Report { return s.report }

// Enabled reports whether functions run sandboxed.
func (s *Sandbox) Enabled() bool { return s != nil && s.report.Isolated }

// SocketGroup is the group every function is a member of when functions have ids of their own (the platform runs
// as root): the platform gives its sockets this group (mode 0660). ok is false otherwise.
func (s *Sandbox) SocketGroup() (gid uint32, ok bool) {
	if !s.Enabled() || s.userNS {
		return 0, false
	}
	return s.cfg.IDs.First, true
}

// Identity returns who function's processes run as: its own ids (allocated at first use, kept until Release) as
// root, this process's user otherwise.
func (s *Sandbox) Identity(function string) Identity {
	if _, ok := s.SocketGroup(); !ok {
		return Identity{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.ids[function]
	if !ok {
		id = s.allocateLocked()
		s.ids[function] = id
	}
	return Identity{UID: id, GID: id, Groups: []uint32{s.cfg.IDs.First}}
}

// Borrow returns who one sandboxed task that is not a function (the install of a function's requirements) runs
// as, and a function that gives the identity back once the task has ended: as root, a user and group of the range
// that no function and no other task holds, without the socket group; otherwise this process's user.
func (s *Sandbox) Borrow(task string) (id Identity, release func()) {
	if _, ok := s.SocketGroup(); !ok {
		return Identity{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}, func() {}
	}
	key := "\x00task " + task // never a function's name
	s.mu.Lock()
	uid := s.allocateLocked()
	for n := 0; ; n++ { // a key of its own even when the same task runs twice at once
		if _, held := s.ids[fmt.Sprintf("%s %d", key, n)]; !held {
			key = fmt.Sprintf("%s %d", key, n)
			break
		}
	}
	s.ids[key] = uid
	s.mu.Unlock()
	return Identity{UID: uid, GID: uid}, func() { s.Release(key) }
}

// allocateLocked returns the next id no function holds, round robin over the range so that an id released by a
// deleted function is the last to be given again. With every id held, ids are shared (the namespaces still keep
// functions apart).
func (s *Sandbox) allocateLocked() uint32 {
	n := s.cfg.IDs.Count - 1
	held := make(map[uint32]bool, len(s.ids))
	for _, id := range s.ids {
		held[id] = true
	}
	for i := uint32(0); i < n; i++ {
		id := s.cfg.IDs.First + 1 + (s.next+i)%n
		if !held[id] {
			s.next = (s.next + i + 1) % n
			return id
		}
	}
	id := s.cfg.IDs.First + 1 + s.next
	s.next = (s.next + 1) % n
	return id
}

// Release forgets a function's ids (it was deleted).
func (s *Sandbox) Release(function string) {
	s.mu.Lock()
	delete(s.ids, function)
	s.mu.Unlock()
}

// TmpBytes is the size of a function's /tmp and /dev/shm.
func (s *Sandbox) TmpBytes() int64 { return s.cfg.TmpBytes }

// UserNS reports whether sandboxes use the user-namespace variant (the platform is not root).
func (s *Sandbox) UserNS() bool { return s.userNS }

// Command returns the command that runs spec in a sandbox; spec.UserNS is set from the sandbox's variant. release
// must be called once the command has started (or failed to): it closes this process's copy of the spec.
func (s *Sandbox) Command(spec Spec) (cmd *exec.Cmd, release func(), err error) {
	if !s.Enabled() {
		return nil, nil, fmt.Errorf("sandbox: %w: %s", ErrUnavailable, s.report.Reason)
	}
	spec.UserNS = s.userNS
	if spec.TmpBytes <= 0 {
		spec.TmpBytes = s.cfg.TmpBytes
	}
	return command(spec)
}

// command builds the init's command: this binary again (through /proc/self/exe, which needs no search permission
// on the folders above it) as InitName, in new mount, PID, IPC and UTS namespaces (and a user namespace when
// spec.UserNS), its own process group, SIGKILL when this thread's process dies, the spec on descriptor 3.
func command(spec Spec) (*exec.Cmd, func(), error) {
	if spec.Root == "" || !filepath.IsAbs(spec.Root) {
		return nil, nil, fmt.Errorf("sandbox: root %q must be an absolute path", spec.Root)
	}
	if !spec.Probe && (len(spec.Argv) == 0 || spec.Argv[0] == "") {
		return nil, nil, errors.New("sandbox: no program to run")
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: %w", err)
	}
	fd, err := unix.MemfdCreate("faas-gpu-sandbox-spec", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox: spec file: %w", err)
	}
	f := os.NewFile(uintptr(fd), "sandbox-spec")
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sandbox: spec file: %w", err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sandbox: spec file: %w", err)
	}
	attrs := &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
	}
	if spec.UserNS {
		attrs.Cloneflags |= syscall.CLONE_NEWUSER
		attrs.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		attrs.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
		attrs.GidMappingsEnableSetgroups = false
		attrs.Credential = &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true}
	}
	cmd := &exec.Cmd{Path: "/proc/self/exe", Args: []string{InitName}, Env: []string{}, Dir: "/",
		ExtraFiles: []*os.File{f}, SysProcAttr: attrs}
	return cmd, func() { f.Close() }, nil
}

// probe builds one sandbox of the given variant around an empty root and waits for its init to check it.
func (s *Sandbox) probe(ctx context.Context, userNS bool) error {
	root, err := os.MkdirTemp("", "faas-gpu-sandbox-probe-")
	if err != nil {
		return fmt.Errorf("sandbox probe: %w", err)
	}
	defer os.Remove(root)
	id := Identity{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
	if !userNS {
		id = Identity{UID: s.cfg.IDs.First + 1, GID: s.cfg.IDs.First + 1, Groups: []uint32{s.cfg.IDs.First}}
	}
	spec := Spec{Probe: true, Root: root, Hostname: "probe", ReadOnly: SystemPaths(), TmpBytes: 1 << 20,
		UserNS: userNS, ID: id}
	cmd, release, err := command(spec)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	err = cmd.Start()
	release()
	variant := "as root with per-function ids"
	if userNS {
		variant = "in an unprivileged user namespace"
	}
	if err != nil {
		return fmt.Errorf("%s: %w", variant, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t := time.NewTimer(probeTimeout)
	defer t.Stop()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return ctx.Err()
	case <-t.C:
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s: the probe did not finish within %s", variant, probeTimeout)
	}
	if err != nil {
		return fmt.Errorf("%s: %v: %s", variant, err, strings.TrimSpace(out.String()))
	}
	return nil
}
