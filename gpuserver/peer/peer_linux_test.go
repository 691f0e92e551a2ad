package peer

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary, started with envConnect naming a socket, connects to it and waits for its stdin to close; with
// envNest set it first starts itself again in a PID namespace of its own, which connects too.
const (
	envConnect = "FAAS_GPU_PEER_TEST_CONNECT"
	envNest    = "FAAS_GPU_PEER_TEST_NEST"
)

func TestMain(m *testing.M) {
	if sock := os.Getenv(envConnect); sock != "" {
		os.Exit(connectAndWait(sock))
	}
	os.Exit(m.Run())
}

func connectAndWait(sock string) int {
	if os.Getenv(envNest) != "" {
		child := exec.Command("/proc/self/exe")
		child.Env = []string{envConnect + "=" + sock}
		child.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
		child.Stdin, child.Stdout = os.Stdin, os.Stdout
		if err := child.Start(); err != nil {
			fmt.Println("nested:", err)
			return 1
		}
		defer child.Wait()
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Println("connect:", err)
		return 1
	}
	defer c.Close()
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// inSandbox starts the test binary in a user and PID namespace of its own (this user's id mapped to root inside, as
// faas-gpu up's sandbox does without root); it connects to sock (and, nested, a child of its own in a PID namespace
// below).
func inSandbox(t *testing.T, sock string, nested bool) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = []string{envConnect + "=" + sock}
	if nested {
		cmd.Env = append(cmd.Env, envNest+"=1")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSPC) {
			t.Skipf("this kernel refuses a user namespace here: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = in.Close()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("sandboxed process: %s", out.String())
		}
	})
}

// TestSandboxesAreTheirOwnPeers: processes of one user in PID namespaces of their own below this process's (the
// sandboxes faas-gpu up starts functions in; without root they all run under up's uid) are one peer each, apart
// from each other and from this process's own connections; a PID namespace a sandbox makes inside itself is the
// same peer as the sandbox.
func TestSandboxesAreTheirOwnPeers(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accept := func() string {
		t.Helper()
		_ = l.(*net.UnixListener).SetDeadline(time.Now().Add(30 * time.Second))
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return Of(c)
	}
	own, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	mine := accept()
	if want := fmt.Sprintf("uid:%d", os.Geteuid()); mine != want {
		t.Fatalf("this process's connection counts against %q, want %q", mine, want)
	}
	inSandbox(t, sock, false)
	a := accept()
	inSandbox(t, sock, false)
	b := accept()
	inSandbox(t, sock, true) // it and its nested child connect, in either order
	c1, c2 := accept(), accept()
	for _, k := range []string{a, b, c1} {
		if !strings.HasPrefix(k, mine+"/pidns:") || strings.HasSuffix(k, "?") {
			t.Errorf("a sandbox's connection counts against %q, want %s/pidns:<its namespace>", k, mine)
		}
	}
	if a == b || a == c1 || b == c1 {
		t.Errorf("three sandboxes count against %q, %q, %q: want three peers", a, b, c1)
	}
	if c1 != c2 {
		t.Errorf("a sandbox counts against %q, a PID namespace it made inside against %q: want one peer", c1, c2)
	}
}
