package connlimit

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestLocalUsersAreTheirOwnPeers: every local client reaches a loopback listener from 127.0.0.1, so a function on
// faas-gpu up (which shares the machine's network) was the same peer as faas-cli on that machine: against up, one
// function's 1,500 stalled connections to the gateway made every local call answer 503 for as long as it held them.
// A loopback client is now its address and its socket's user: another user's storm takes its own share, and this
// user is served during it.
func TestLocalUsersAreTheirOwnPeers(t *testing.T) {
	l, addr := serve(t, Config{Surface: "test", MaxConns: 100, MaxPerPeer: 5})
	own, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	waitOpen(t, l, 1)
	l.count.mu.Lock()
	var keys []string
	for k := range l.count.peers {
		keys = append(keys, k)
	}
	l.count.mu.Unlock()
	if want := fmt.Sprintf("127.0.0.1/uid:%d", os.Geteuid()); len(keys) != 1 || keys[0] != want {
		t.Fatalf("a loopback connection of this process counts against %v, want %s", keys, want)
	}
	own.Close()
	waitOpen(t, l, 0)
	if os.Geteuid() != 0 {
		t.Skip("not root: another user's storm cannot be started here")
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		python = "/usr/bin/python3" // reachable by another user (a pyenv shim under /root is not)
	}
	storm := exec.Command(python, "-c", `
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
conns = []
for i in range(20):
    s = socket.create_connection((host, int(port)))
    s.send(b"GET / HTTP/1.1\r\nHost: x\r\n")
    conns.append(s)
print("connected", flush=True)
sys.stdin.readline()
`, addr)
	storm.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	in, err := storm.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := storm.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := storm.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close(); _ = storm.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "connected\n" {
		t.Fatalf("the storm: %q %v", line, err)
	}
	waitOpen(t, l, 5)
	for deadline := time.Now().Add(10 * time.Second); l.Refused() < 15 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond) // the kernel holds the rest until the accept loop reaches them
	}
	if l.Refused() < 15 {
		t.Fatalf("refused %d of another user's 20 stalled connections, want all beyond its 5", l.Refused())
	}
	if got := get(t, "127.0.0.1", addr); got != "HTTP/1.1 200 OK" {
		t.Fatalf("this user from 127.0.0.1 during another local user's storm: %q, want 200", got)
	}
}
