package sandbox

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// InitName is argv[0] of a sandbox's init: this binary started again by Command.
const InitName = "faas-gpu-sandbox-init"

// Exit statuses of the init itself (the function's own status is passed on unchanged; death by signal N is
// 128+N).
const (
	exitSetup = 125 // the sandbox could not be built; the reason is on stderr
	exitStart = 126 // the program could not be started
)

// IsInit reports whether this process is a sandbox's init (see RunInit).
func IsInit() bool { return len(os.Args) > 0 && os.Args[0] == InitName }

// RunInit is the whole life of a sandbox's init; it returns the exit status. Call it first thing in main when
// IsInit reports true: `if sandbox.IsInit() { os.Exit(sandbox.RunInit()) }`.
func RunInit() int {
	// Capabilities, the bounding set and no_new_privs belong to a thread: everything below, the start of the
	// program included, happens on this one.
	runtime.LockOSThread()
	spec, err := readSpec()
	if err != nil {
		fmt.Fprintf(os.Stderr, "faas-gpu sandbox: %v\n", err)
		return exitSetup
	}
	if err := build(spec); err != nil {
		fmt.Fprintf(os.Stderr, "faas-gpu sandbox: %v\n", err)
		return exitSetup
	}
	if err := dropPrivileges(spec); err != nil {
		fmt.Fprintf(os.Stderr, "faas-gpu sandbox: %v\n", err)
		return exitSetup
	}
	if spec.Probe {
		if err := check(spec); err != nil {
			fmt.Fprintf(os.Stderr, "faas-gpu sandbox: probe: %v\n", err)
			return exitSetup
		}
		return 0
	}
	return supervise(spec)
}

// readSpec reads the Spec on descriptor 3 and closes it.
func readSpec() (Spec, error) {
	f := os.NewFile(3, "sandbox-spec")
	if f == nil {
		return Spec{}, errors.New("no spec on descriptor 3")
	}
	defer f.Close()
	var spec Spec
	if err := json.NewDecoder(io.LimitReader(f, 16<<20)).Decode(&spec); err != nil {
		return Spec{}, fmt.Errorf("reading the spec: %w", err)
	}
	return spec, nil
}

// build makes the sandbox's file system and pivots into it: a read-only tmpfs root holding the bound paths, a
// /dev with the harmless devices, a private /tmp and /dev/shm, a /proc of the new PID namespace, and passwd and
// group files that name only the sandbox's users.
func build(spec Spec) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	root := filepath.Clean(spec.Root)
	if err := unix.Mount("faas-gpu", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
		"mode=0755,size=4m,nr_inodes=4096"); err != nil {
		return fmt.Errorf("root tmpfs on %s: %w", root, err)
	}
	in := func(p string) string { return filepath.Join(root, p) }
	size := strconv.FormatInt(spec.TmpBytes, 10)
	// /tmp first: bound paths below /tmp (a build context in a temporary folder) go on top of it.
	if err := mountTmpfs(in("/tmp"), unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size="+size); err != nil {
		return err
	}
	if err := buildDev(in("/dev"), size); err != nil {
		return err
	}
	shown := append([]string(nil), spec.ReadOnly...)
	sort.Strings(shown)
	writable := map[string]bool{} // mount points under root
	var all []string
	for _, w := range spec.Writable {
		w = filepath.Clean(w)
		if !filepath.IsAbs(w) || w == "/" {
			return fmt.Errorf("cannot show %q read-write: want an absolute path other than /", w)
		}
		if !writable[in(w)] {
			writable[in(w)] = true
			all = append(all, w)
		}
	}
	for _, p := range shown {
		if !writable[in(filepath.Clean(p))] {
			all = append(all, p)
		}
	}
	sort.Strings(all) // parents before children, so that a child's mount goes on top of its parent's
	for _, p := range all {
		var err error
		switch {
		case writable[in(p)]:
			err = showWritable(root, p)
		case within(p, shown, p) && !within(p, spec.Writable, p):
			// visible (read-only) through the shown folder that holds it
		case slices.Contains(spec.Folders, p):
			err = showFolder(root, p)
		default:
			err = show(root, p, shown)
		}
		if err != nil {
			return err
		}
	}
	for _, s := range spec.Sockets {
		if within(s, shown, s) {
			continue
		}
		if err := bindFile(s, in(s)); err != nil {
			return fmt.Errorf("socket %s: %w", s, err)
		}
	}
	// A folder the binds above created inside /tmp would belong to the program in a user namespace, which could
	// then move it aside and put something of its own in its place: each is bound onto itself (made read-only below
	// with everything else), which pins it.
	for _, top := range topsUnder(append(all, spec.Sockets...), "/tmp") {
		if err := unix.Mount(in(top), in(top), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("pinning %s: %w", top, err)
		}
	}
	if err := writeAccounts(in("/etc"), spec); err != nil {
		return err
	}
	// /proc of the new PID namespace, mounted while the machine's /proc is still visible (the kernel requires one
	// fully visible proc mount in the namespace to allow another).
	if err := os.MkdirAll(in("/proc"), 0o755); err != nil {
		return err
	}
	if err := unix.Mount("proc", in("/proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	if err := readOnlyTree(root, map[string]bool{in("/tmp"): true, in("/dev/shm"): true, in("/proc"): true},
		writable); err != nil {
		return err
	}
	hostname := spec.Hostname
	if hostname == "" {
		hostname = "function"
	}
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	// pivot_root(".", ".") stacks the old root under the new one; detaching it leaves only the new one.
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if spec.Dir != "" {
		if err := unix.Chdir(spec.Dir); err != nil {
			return fmt.Errorf("working directory %s: %w", spec.Dir, err)
		}
	}
	return nil
}

func mountTmpfs(dir string, flags uintptr, opts string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", flags, opts); err != nil {
		return fmt.Errorf("tmpfs on %s: %w", dir, err)
	}
	return nil
}

// buildDev makes /dev: a small tmpfs with the null, zero, full, random, urandom and tty devices bound from the
// machine's, the usual links into /proc/self/fd, and a private /dev/shm.
func buildDev(dev, size string) error {
	if err := mountTmpfs(dev, unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k,nr_inodes=64"); err != nil {
		return err
	}
	for _, name := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := bindFile("/dev/"+name, filepath.Join(dev, name)); err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	return mountTmpfs(filepath.Join(dev, "shm"), unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size="+size)
}

// show makes path p of the machine visible at the same place under root. A symbolic link whose target another
// shown path holds is copied as a link (/bin -> usr/bin); any other is followed and its target bound (an
// /etc/resolv.conf that points into /run). Missing paths are left out.
func show(root, p string, shown []string) error {
	p = filepath.Clean(p)
	if !filepath.IsAbs(p) || p == "/" {
		return fmt.Errorf("cannot show %q: want an absolute path other than /", p)
	}
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	dst := filepath.Join(root, p)
	src := p
	if fi.Mode()&os.ModeSymlink != 0 {
		resolved, err := filepath.EvalSymlinks(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if within(resolved, shown, p) {
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			return os.Symlink(target, dst)
		}
		src = resolved
		if fi, err = os.Stat(resolved); err != nil {
			return err
		}
	}
	if fi.IsDir() {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("binding %s: %w", p, err)
		}
		return nil
	}
	if err := bindFile(src, dst); err != nil {
		return fmt.Errorf("binding %s: %w", p, err)
	}
	return nil
}

// showFolder binds folder p of the machine read-only at the same place under root from a descriptor opened with
// O_NOFOLLOW|O_DIRECTORY: a link at p (one swapped in after the platform looked) is refused, never followed.
func showFolder(root, p string) error {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("showing %s: not a folder (a symbolic link, or gone): %w", p, err)
	}
	defer unix.Close(fd)
	dst := filepath.Join(root, p)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(fd), dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding %s: %w", p, err)
	}
	return nil
}

// showWritable binds folder p of the machine at the same place under root, to be left writable by readOnlyTree.
func showWritable(root, p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("showing %s read-write: %w", p, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("showing %s read-write: not a folder", p)
	}
	dst := filepath.Join(root, p)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(p, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding %s read-write: %w", p, err)
	}
	return nil
}

// within reports whether path lies inside one of shown other than self.
func within(path string, shown []string, self string) bool {
	for _, s := range shown {
		s = filepath.Clean(s)
		if s != self && (path == s || strings.HasPrefix(path, s+"/")) {
			if fi, err := os.Lstat(s); err == nil && fi.Mode()&os.ModeSymlink == 0 {
				return true
			}
		}
	}
	return false
}

// bindFile binds one file (a device, a socket, a regular file) onto an empty file made for it.
func bindFile(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	return unix.Mount(src, dst, "", unix.MS_BIND, "")
}

// topsUnder returns the first folder below dir of every path inside dir.
func topsUnder(paths []string, dir string) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range paths {
		rest, ok := strings.CutPrefix(filepath.Clean(p), dir+"/")
		if !ok {
			continue
		}
		top := filepath.Join(dir, strings.SplitN(rest, "/", 2)[0])
		if top != filepath.Clean(p) && !seen[top] {
			seen[top] = true
			out = append(out, top)
		}
	}
	return out
}

// writeAccounts writes /etc/passwd and /etc/group naming root, nobody and the program's own user and group (the
// machine's accounts stay out of sight; Python's getpass and pwd find the program's user).
func writeAccounts(etc string, spec Spec) error {
	uid, gid := spec.ID.UID, spec.ID.GID
	if spec.UserNS {
		uid, gid = 0, 0
	}
	passwd := "root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	group := "root:x:0:\nnogroup:x:65534:\n"
	if uid != 0 {
		passwd += fmt.Sprintf("function:x:%d:%d:faas-gpu function:/tmp:/usr/sbin/nologin\n", uid, gid)
		group += fmt.Sprintf("function:x:%d:\n", gid)
	}
	for _, g := range spec.ID.Groups {
		if !spec.UserNS {
			group += fmt.Sprintf("faas-gpu-sockets:x:%d:function\n", g)
		}
	}
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(etc, "passwd"), []byte(passwd), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(etc, "group"), []byte(group), 0o644)
}

// readOnlyTree remounts every mount at or below root read-only, nosuid, and nodev (devices excepted), keeping
// the flags the kernel locks on mounts a user namespace inherited; the mounts in keep stay as they are, those in
// writable lose only set-id programs and devices.
func readOnlyTree(root string, keep, writable map[string]bool) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMountPath(fields[4])
		if p == root || strings.HasPrefix(p, root+"/") {
			points = append(points, p)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	for _, p := range points {
		if keep[p] {
			continue
		}
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err != nil {
			return fmt.Errorf("statfs %s: %w", p, err)
		}
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID)
		if !writable[p] {
			flags |= unix.MS_RDONLY
		}
		var fi unix.Stat_t
		if err := unix.Stat(p, &fi); err == nil && fi.Mode&unix.S_IFMT != unix.S_IFCHR {
			flags |= unix.MS_NODEV
		}
		for st2, ms := range map[int64]uintptr{unix.ST_NODEV: unix.MS_NODEV, unix.ST_NOEXEC: unix.MS_NOEXEC,
			unix.ST_NOATIME: unix.MS_NOATIME, unix.ST_NODIRATIME: unix.MS_NODIRATIME,
			unix.ST_RELATIME: unix.MS_RELATIME} {
			if st.Flags&st2 != 0 {
				flags |= ms
			}
		}
		if err := unix.Mount("", p, "", flags, ""); err != nil {
			if writable[p] {
				return fmt.Errorf("remounting %s without set-id programs and devices: %w", strings.TrimPrefix(p, root), err)
			}
			return fmt.Errorf("making %s read-only: %w", strings.TrimPrefix(p, root), err)
		}
	}
	return nil
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Secure bits (linux/securebits.h) that keep root of a user namespace from regaining capabilities at exec.
const (
	secbitNoroot                  = 1 << 0
	secbitNorootLocked            = 1 << 1
	secbitNoSetuidFixup           = 1 << 2
	secbitNoSetuidFixupLocked     = 1 << 3
	secbitKeepCapsLocked          = 1 << 5
	secbitNoCapAmbientRaise       = 1 << 6
	secbitNoCapAmbientRaiseLocked = 1 << 7
)

// dropPrivileges leaves this thread (the one that starts the program) unable to give the program any privilege:
// no new privileges at exec, an empty capability bounding set, no ambient or inheritable capabilities; in a user
// namespace also no capabilities at all and root without its privileges. The init itself is made non-dumpable,
// so that the program can neither trace it nor read its /proc files.
func dropPrivileges(spec Spec) error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	for c := 0; ; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			break // past the last capability
		}
		if err != nil {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	if spec.UserNS {
		bits := secbitNoroot | secbitNorootLocked | secbitNoSetuidFixup | secbitNoSetuidFixupLocked |
			secbitKeepCapsLocked | secbitNoCapAmbientRaise | secbitNoCapAmbientRaiseLocked
		if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0); err != nil {
			return fmt.Errorf("securebits: %w", err)
		}
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return fmt.Errorf("dropping capabilities: %w", err)
		}
	} else {
		// Root keeps CAP_SETUID and CAP_SETGID until the program's start switches to its ids, which clears the
		// rest; the inheritable set must be empty for that.
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return fmt.Errorf("reading capabilities: %w", err)
		}
		data[0].Inheritable, data[1].Inheritable = 0, 0
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return fmt.Errorf("clearing inheritable capabilities: %w", err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("dumpable: %w", err)
	}
	return nil
}

// check is the probe's test of its own sandbox: PID 1 of a namespace that holds nothing else, a read-only root,
// an empty bounding set, a writable /tmp, and a program that starts under the functions' identity.
func check(spec Spec) error {
	if os.Getpid() != 1 {
		return fmt.Errorf("pid %d, want 1 in a new PID namespace", os.Getpid())
	}
	if err := os.WriteFile("/probe", nil, 0o644); !errors.Is(err, unix.EROFS) {
		return fmt.Errorf("writing the root: %v, want a read-only file system", err)
	}
	if err := os.WriteFile("/tmp/probe", []byte("x"), 0o644); err != nil {
		return fmt.Errorf("writing /tmp: %w", err)
	}
	if v, _, errno := unix.Syscall(unix.SYS_PRCTL, unix.PR_CAPBSET_READ, unix.CAP_SYS_ADMIN, 0); errno == 0 && v != 0 {
		return errors.New("CAP_SYS_ADMIN is still in the bounding set")
	}
	for _, p := range []string{"/usr/bin/true", "/bin/true"} {
		if _, err := os.Stat(p); err == nil {
			spec.Argv, spec.Env, spec.Dir = []string{p}, nil, "/"
			cmd, err := startProgram(spec)
			if err != nil {
				return err
			}
			if err := cmd.Wait(); err != nil {
				return fmt.Errorf("running %s as %d:%d: %w", p, spec.ID.UID, spec.ID.GID, err)
			}
			break
		}
	}
	return nil
}

// startProgram starts the program on this thread, in a process group of its own, as the function's identity
// when the init is root.
func startProgram(spec Spec) (*exec.Cmd, error) {
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Env = spec.Env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	cmd.Dir = spec.Dir
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if !spec.UserNS {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: spec.ID.UID, Gid: spec.ID.GID, Groups: spec.ID.Groups}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", spec.Argv[0], err)
	}
	return cmd, nil
}

// supervise starts the program, passes the signals the platform sends on to its process group, reaps every
// orphan the namespace hands to its PID 1, and returns the program's exit status once it has ended.
func supervise(spec Spec) int {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1,
		unix.SIGUSR2)
	cmd, err := startProgram(spec)
	if err != nil {
		fmt.Fprintf(os.Stderr, "faas-gpu sandbox: %v\n", err)
		return exitStart
	}
	child := cmd.Process.Pid
	for sig := range sigs {
		if sig != unix.SIGCHLD {
			_ = unix.Kill(-child, sig.(syscall.Signal))
			continue
		}
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err != nil || pid <= 0 {
				break
			}
			if pid != child {
				continue
			}
			switch {
			case ws.Exited():
				return ws.ExitStatus()
			case ws.Signaled():
				fmt.Fprintf(os.Stderr, "faas-gpu sandbox: the function was killed by signal %d (%s)\n",
					int(ws.Signal()), ws.Signal())
				return 128 + int(ws.Signal())
			}
		}
	}
	return exitStart
}
