package remoting

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// stormServer serves function "f" (token "tok") with 32 connections waiting for their hello at most, 8 of them of
// one peer, and a hello timeout longer than the test: the silent connections stay for the whole test.
func stormServer(t *testing.T) *wireRig {
	t.Helper()
	funcs := registry{"f": {pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20}, "tok"}}
	return startServerWith(t, funcs, func(c *Config) {
		c.MaxPendingHellos, c.MaxPendingHellosPerPeer = 32, 8
		c.HelloTimeout = 10 * time.Minute
	})
}

// stormCommand is a python process that opens 40 connections to sock that never say hello, says "connected" and
// holds them until a line on its stdin.
func stormCommand(python, sock string) *exec.Cmd {
	return exec.Command(python, "-c", `
import socket, sys
conns = []
for i in range(40):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    conns.append(s)
print("connected", flush=True)
sys.stdin.readline()
`, sock)
}

// startStorm starts storm (a stormCommand) and returns once it holds its connections, or the error of a start that
// failed; the storm ends when the test does.
func startStorm(t *testing.T, storm *exec.Cmd) error {
	t.Helper()
	in, err := storm.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := storm.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	storm.Stderr = &stderr
	if err := storm.Start(); err != nil {
		return err
	}
	t.Cleanup(func() { _ = in.Close(); _ = storm.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "connected\n" {
		t.Fatalf("the storm: %q %v\n%s", line, err, stderr.String())
	}
	return nil
}

// TestHellolessConnectionsOfOnePeerLeaveRoomForOthers: another user's process opens connections to the remoting
// socket that never say hello. Before, 128 of them took every pending slot of the node, and every function's new
// CUDA session failed (CUDA_ERROR_NO_DEVICE in the shim) until they timed out. Now a peer's pending connections
// are bounded (8 here): the rest of its storm is refused at once, and a function of another user says hello and
// gets its session while the storm holds. It needs root (to run the storm as another user); as another user it
// checks the per-peer bound alone.
func TestHellolessConnectionsOfOnePeerLeaveRoomForOthers(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		python = "/usr/bin/python3" // reachable by another user (a pyenv shim under /root is not)
	}
	r := stormServer(t)
	// The storm: 40 connections that never say hello, from a process of another user when we may start one.
	storm := stormCommand(python, r.sock)
	other := os.Geteuid() == 0
	if other {
		// The socket and the test's directories up to the temp dir become reachable for the other user.
		for p := r.sock; strings.HasPrefix(p, os.TempDir()) && p != os.TempDir(); p = filepath.Dir(p) {
			if err := os.Chmod(p, 0o777); err != nil {
				t.Fatal(err)
			}
		}
		storm.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	if err := startStorm(t, storm); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, "the storm beyond its peer's bound refused", func() bool {
		return r.srv.Stats().Refused["pending_hellos_per_peer"] >= 32
	})
	r.srv.mu.Lock()
	pending := r.srv.pending
	r.srv.mu.Unlock()
	if pending > 8 {
		t.Fatalf("%d connections of one peer wait for their hello, bound 8", pending)
	}
	if !other {
		t.Skip("not root: the storm ran as this user; the per-peer bound held, another user's hello is not tried")
	}
	w, err := dialWire(t, r.sock, "f", "tok")
	if err != nil {
		t.Fatalf("a function's hello during another user's storm: %v", err)
	}
	w.close()
}

// TestHellolessConnectionsOfOneSandboxLeaveRoomForOthers: faas-gpu up without root runs every function under its
// own uid, each in a user and PID namespace of its own, so a bound per user was one bound for every function
// together: against up as nobody, one function's 200 silent connections to the remoting socket made every other
// function's new CUDA session fail (CUDA_ERROR_NO_DEVICE, the replica restarting with back-off until the storm
// ended, 44 s). Now a sandbox (a PID namespace below the server's) is a peer of its own: its storm is bounded, and a
// process of the same user outside it says hello while the storm holds.
func TestHellolessConnectionsOfOneSandboxLeaveRoomForOthers(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	r := stormServer(t)
	storm := stormCommand(python, r.sock)
	// As faas-gpu up's sandbox without root: this user is root in a user namespace of its own, in a PID namespace
	// of its own.
	storm.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}}
	if err := startStorm(t, storm); err != nil {
		t.Skipf("this kernel refuses a user namespace here: %v", err)
	}
	testkit.Eventually(t, 60*time.Second, "the storm beyond its sandbox's bound refused", func() bool {
		return r.srv.Stats().Refused["pending_hellos_per_peer"] >= 32
	})
	w, err := dialWire(t, r.sock, "f", "tok")
	if err != nil {
		t.Fatalf("a hello of the same user outside the storming sandbox: %v", err)
	}
	w.close()
}
