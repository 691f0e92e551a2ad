package harness

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// stopGroup sends SIGTERM to the process group pid leads, waits a grace period, then sends SIGKILL. The API
// server drains watches for a long time and is thrown away anyway, so it gets a short grace.
func stopGroup(name string, pid int, logf func(string, ...any)) {
	if !alive(pid) {
		return
	}
	grace := 20 * time.Second
	if name == "kube-apiserver" || name == "etcd" {
		grace = 3 * time.Second
	}
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if alive(pid) {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		for i := 0; i < 50 && alive(pid); i++ {
			time.Sleep(100 * time.Millisecond)
		}
		logf("stopped %s (pid %d) with SIGKILL", name, pid)
		return
	}
	logf("stopped %s (pid %d)", name, pid)
}

// parents maps every process to its parent.
func parents() map[int]int {
	out := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 {
			if ppid, err := strconv.Atoi(f[1]); err == nil {
				out[pid] = ppid
			}
		}
	}
	return out
}

// shimsOf finds the containerd shims serving the containerd at socket (their command line names its address).
func shimsOf(socket string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := bytes.Split(b, []byte{0})
		if len(args) == 0 || !strings.HasPrefix(filepath.Base(string(args[0])), "containerd-shim") {
			continue
		}
		for _, a := range args {
			if string(a) == socket {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// killTree kills pid and every process below it (a shim and the containers it runs), children first.
func killTree(pid int, logf func(string, ...any)) {
	pp := parents()
	children := map[int][]int{}
	for c, p := range pp {
		children[p] = append(children[p], c)
	}
	var order []int
	var walk func(int)
	walk = func(p int) {
		for _, c := range children[p] {
			walk(c)
		}
		order = append(order, p)
	}
	walk(pid)
	for _, p := range order {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	logf("killed containerd shim %d and %d processes below it", pid, len(order)-1)
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// insecureTLS is for the health endpoints of the controller manager and scheduler, which serve self-signed
// certificates on loopback.
func insecureTLS() *tls.Config { return &tls.Config{InsecureSkipVerify: true} } //nolint:gosec // loopback health checks

// adminHTTPClient authenticates as the cluster admin and trusts the cluster's CA.
func (c *Cluster) adminHTTPClient() (*http.Client, error) {
	cert, err := tls.LoadX509KeyPair(c.pki.path("admin.crt"), c.pki.path("admin.key"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(c.pki.caCert)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
	}}, nil
}
