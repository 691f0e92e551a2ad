package api_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faas-gpu/faas-gpu/gpuserver/api"
	"github.com/faas-gpu/faas-gpu/gpuserver/auth"
	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// limitedAPI is the API with authentication and the given limits on a Unix socket and a TCP listener, both
// through Listener.
type limitedAPI struct {
	key  auth.Key
	sock string
	tcp  string
	reg  *prometheus.Registry
}

func serveLimited(t *testing.T, limits api.Limits) *limitedAPI {
	t.Helper()
	p, err := pool.NewFCFS([]pool.GPU{{Name: "gpu0", MemoryBytes: 4 << 30}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	key, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := api.New(p, reg, reg, nil, api.WithAuth(key), api.WithLimits(limits))
	if err != nil {
		t.Fatal(err)
	}
	a := &limitedAPI{key: key, sock: filepath.Join(t.TempDir(), "gpuserver.sock"), reg: reg}
	ul, err := net.Listen("unix", a.sock)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.tcp = tl.Addr().String()
	for _, l := range []net.Listener{ul, tl} {
		hs := srv.NewHTTPServer()
		go func() { _ = hs.Serve(srv.Listener(l)) }()
		t.Cleanup(func() { _ = hs.Close() })
	}
	return a
}

// status sends one complete request on a fresh connection from dial and returns the status (0: no answer).
func status(t *testing.T, dial func() (net.Conn, error), req string) int {
	t.Helper()
	c, err := dial()
	if err != nil {
		return 0
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

const healthz = "GET /healthz HTTP/1.1\r\nHost: gpuserver\r\n\r\n"

// TestStalledRequestsAreBounded is the descriptor storm on the gpuserver API: a peer opens connections that never
// finish their headers (or their body). Before, the API read bodies before checking credentials, had no body
// deadline and no bound per peer, so such connections piled up until the process had no descriptors left and
// every function's acquire failed. Now a peer's connections beyond its bound are answered 503 at once, another
// peer is served meanwhile, stalled headers and bodies are cut at their deadlines (408 for a body), a request
// without a credential is refused before its body is read, idle connections without a binding are closed, and the
// stalled peer is served again once its connections are gone.
func TestStalledRequestsAreBounded(t *testing.T) {
	// The header deadline is long enough that the refusals below come before it even on a loaded 2-core machine
	// (it was 500 ms, and the storm's connections were sometimes cut before the refusals were tried).
	limits := api.Limits{PerPeer: 16, Total: 64, IdleTimeout: 300 * time.Millisecond,
		ReadHeaderTimeout: 2 * time.Second, BodyTimeout: 300 * time.Millisecond}
	a := serveLimited(t, limits)
	unixDial := func() (net.Conn, error) { return net.Dial("unix", a.sock) }
	tcpFrom := func(ip string) func() (net.Conn, error) {
		return func() (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
			return d.Dial("tcp", a.tcp)
		}
	}

	// The storm: one peer (this process's user on the Unix socket, 127.0.0.1 on TCP) fills its bound with
	// connections that never finish their headers.
	var stalled []net.Conn
	for range limits.PerPeer {
		for _, dial := range []func() (net.Conn, error){unixDial, tcpFrom("127.0.0.1")} {
			c, err := dial()
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.WriteString(c, "POST /v1/functions HTTP/1.1\r\nHost: gpuserver\r\n") // and nothing more
			stalled = append(stalled, c)
		}
	}
	defer func() {
		for _, c := range stalled {
			c.Close()
		}
	}()
	start := time.Now()
	if code := status(t, unixDial, healthz); code != http.StatusServiceUnavailable {
		t.Fatalf("the storming user's next connection: %d, want 503 at once", code)
	}
	if code := status(t, tcpFrom("127.0.0.1"), healthz); code != http.StatusServiceUnavailable {
		t.Fatalf("the storming address's next connection: %d, want 503 at once", code)
	}
	if d := time.Since(start); d > limits.ReadHeaderTimeout {
		t.Fatalf("the refusals took %s", d)
	}
	if code := status(t, tcpFrom("127.0.0.2"), healthz); code != http.StatusOK {
		t.Fatalf("another peer during the storm: %d, want 200", code)
	}
	// The stalled connections are cut at the header deadline, and the peer is served again.
	testkit.Eventually(t, 60*time.Second, "the storming user served again", func() bool { return status(t, unixDial, healthz) == 200 })
	testkit.Eventually(t, 60*time.Second, "the storming address served again", func() bool {
		return status(t, tcpFrom("127.0.0.1"), healthz) == 200
	})
	for _, c := range stalled {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 512)); err == nil {
			// the server may answer 408 before it closes; the next read must end
			if _, err := c.Read(make([]byte, 512)); err == nil {
				t.Fatal("a connection with stalled headers is still open")
			}
		}
	}

	// No credential: refused before the body is read (the body is never sent).
	c, err := unixDial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "POST /v1/functions HTTP/1.1\r\nHost: gpuserver\r\nContent-Type: application/json\r\n"+
		"Content-Length: 1000000\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("registration without a credential, body unsent: %v %v, want 401 at once", resp, err)
	}
	resp.Body.Close()

	// With a credential, a body that stalls is cut at the body deadline.
	c2, err := unixDial()
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c2, "POST /v1/functions HTTP/1.1\r\nHost: gpuserver\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"name\":", a.key.AdminToken())
	resp, err = http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil || resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("a stalled body: %v %v, want 408", resp, err)
	}
	resp.Body.Close()

	// An idle connection without a binding is closed; one holding a binding is not.
	idle, err := unixDial()
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	_ = idle.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(idle, healthz)
	br := bufio.NewReader(idle)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an idle connection without a binding: %v, want it closed by the server", err)
	}
	admin := client.New(a.sock, client.WithToken(a.key.AdminToken()))
	ctx := context.Background()
	if err := admin.Register(ctx, pool.FunctionSpec{Name: "f", MemoryBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	lease, b := rawAcquire(t, a.sock, "f", a.key.FunctionToken("f"))
	time.Sleep(3 * limits.IdleTimeout)
	if _, err := fmt.Fprintf(lease, "POST /v1/bindings/%s/release HTTP/1.1\r\nHost: gpuserver\r\n"+
		"Authorization: Bearer %s\r\n\r\n", b.ID, a.key.FunctionToken("f")); err != nil {
		t.Fatal(err)
	}
	resp, err = http.ReadResponse(bufio.NewReader(lease), nil)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("release on a connection that held its binding past the idle timeout: %v %v", resp, err)
	}
	if v := metricValue(t, a.reg, "faas_gpu_api_connections_refused_total"); v < 2 {
		t.Errorf("faas_gpu_api_connections_refused_total = %v, want the refusals counted", v)
	}
}

// TestAPIRecoversFromDescriptorExhaustion: with every descriptor of the process in use, the API's accepts fail;
// once descriptors are free again, it serves again by itself.
func TestAPIRecoversFromDescriptorExhaustion(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	a := serveLimited(t, api.Limits{})
	// A client in another process (its descriptors are its own): it sends a request when told to on stdin.
	client := exec.Command("python3", "-c", `
import socket, sys
sys.stdin.readline()
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"GET /healthz HTTP/1.1\r\nHost: gpuserver\r\nConnection: close\r\n\r\n")
print(s.recv(64).decode().split("\r\n")[0], flush=True)
`, a.sock)
	in, err := client.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := client.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close(); _ = client.Wait() })
	release := testkit.ExhaustDescriptors(t)
	fmt.Fprintln(in, "go")
	time.Sleep(100 * time.Millisecond) // its connection waits in the backlog while accepts fail
	release()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.Contains(line, "200") {
		t.Fatalf("the request sent while descriptors ran out: %q %v, want 200 once they came back", line, err)
	}
	if code := status(t, func() (net.Conn, error) { return net.Dial("unix", a.sock) }, healthz); code != 200 {
		t.Fatalf("a request after the exhaustion: %d", code)
	}
}
