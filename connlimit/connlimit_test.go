package connlimit

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serve runs an HTTP server behind a Listener with the given bounds and returns its address.
func serve(t *testing.T, cfg Config) (*Listener, string) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(raw, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 30 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l, raw.Addr().String()
}

// dialFrom opens a connection from a loopback source address (a peer of its own) and starts a request it never
// finishes (slowloris).
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// get sends a whole request from src and returns the status line.
func get(t *testing.T, src, addr string) string {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		return "write: " + err.Error()
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "read: " + err.Error()
	}
	return strings.TrimSpace(line)
}

func waitOpen(t *testing.T, l *Listener, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.Open() != n {
		if time.Now().After(deadline) {
			t.Fatalf("open connections = %d, want %d", l.Open(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPeerStormLeavesOthersServed: one peer's slowloris storm (200 connections) takes at most its share; its
// excess is refused with a 503 at once, other peers are served during the storm, and the peer is served again once
// its connections close.
func TestPeerStormLeavesOthersServed(t *testing.T) {
	l, addr := serve(t, Config{Surface: "test", MaxConns: 40, MaxPerPeer: 10})
	var storm []net.Conn
	for i := 0; i < 10; i++ {
		storm = append(storm, dialFrom(t, "127.0.0.2", addr))
	}
	waitOpen(t, l, 10)
	for i := 0; i < 190; i++ {
		if got := get(t, "127.0.0.2", addr); !strings.Contains(got, "503") && i == 0 {
			t.Fatalf("the storming peer's next connection: %q, want 503", got)
		}
	}
	if l.Refused() < 190 {
		t.Errorf("refused %d, want every connection beyond the peer's 10", l.Refused())
	}
	if got := get(t, "127.0.0.1", addr); got != "HTTP/1.1 200 OK" {
		t.Errorf("another peer during the storm: %q, want 200", got)
	}
	for _, c := range storm {
		c.Close()
	}
	waitOpen(t, l, 0)
	if got := get(t, "127.0.0.2", addr); got != "HTTP/1.1 200 OK" {
		t.Errorf("the storming peer after its storm: %q, want 200", got)
	}
}

// TestSurfaceLimitHoldsAcrossPeers: peers together never hold more than MaxConns.
func TestSurfaceLimitHoldsAcrossPeers(t *testing.T) {
	l, addr := serve(t, Config{Surface: "test", MaxConns: 12, MaxPerPeer: 5})
	for p := 2; p <= 4; p++ {
		for i := 0; i < 5; i++ {
			dialFrom(t, "127.0.0."+string(rune('0'+p)), addr)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.Open()+int(l.Refused()) < 15 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if l.Open() != 12 || l.Refused() != 3 {
		t.Errorf("open %d, refused %d; want 12 and 3", l.Open(), l.Refused())
	}
}

func TestBudget(t *testing.T) {
	for _, tc := range []struct {
		nofile uint64
		share  float64
		max    int
		want   Limits
	}{
		{1024, 0.5, 4096, Limits{384, 96}},
		{20000, 0.5, 4096, Limits{4096, 1024}},
		{256, 0.5, 4096, Limits{16, 8}},
	} {
		if got := Budget(tc.nofile, tc.share, tc.max); got != tc.want {
			t.Errorf("Budget(%d, %g, %d) = %+v, want %+v", tc.nofile, tc.share, tc.max, got, tc.want)
		}
	}
	if _, err := New(nil, Config{}); err == nil {
		t.Error("New without a bound: no error")
	}
}

func TestPeer(t *testing.T) {
	for addr, want := range map[net.Addr]string{
		&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 5}:                "10.1.2.3",
		&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 5}:    "2001:db8:1:2::/64",
		&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff:4:5:6"), Port: 5}: "2001:db8:1:2::/64",
		&net.UnixAddr{Name: "@", Net: "unix"}:                             "unix",
	} {
		if got := Peer(addr); got != want {
			t.Errorf("Peer(%v) = %q, want %q", addr, got, want)
		}
	}
}

// TestRefusalIsReadAfterTheRequestWasSent: a client that sends its whole request before reading (every HTTP
// client) reads the 503, not a reset: closing a socket with its request unread resets it, and the reset could
// overtake the answer (seen as "connection reset by peer" on a fast machine).
func TestRefusalIsReadAfterTheRequestWasSent(t *testing.T) {
	l, addr := serve(t, Config{Surface: "test", MaxConns: 4, MaxPerPeer: 1})
	dialFrom(t, "127.0.0.2", addr)
	waitOpen(t, l, 1)
	req := "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("p", 8<<10) + "\r\n\r\n"
	for i := range 20 {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			c.Close()
			t.Fatalf("try %d: write: %v", i, err)
		}
		time.Sleep(20 * time.Millisecond) // the server has refused and closed by now
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil || !strings.Contains(line, "503") {
			t.Fatalf("try %d: %q %v, want the 503", i, line, err)
		}
	}
}

// TestGoClientReadsTheRefusal: Go's HTTP client (faas-cli's) reads the refusal as a 503. Its transport drops
// bytes that arrive on a connection before its request was written ("Unsolicited response received on idle HTTP
// channel") and fails the request, so a refusal written at accept, before the request arrived, reached a Go client
// as an error whenever the server was faster than the client.
func TestGoClientReadsTheRefusal(t *testing.T) {
	l, addr := serve(t, Config{Surface: "test", MaxConns: 4, MaxPerPeer: 1})
	dialFrom(t, "127.0.0.1", addr)
	waitOpen(t, l, 1)
	// The dial returns late, as on a busy client: the server has long accepted (and, before, answered) by then.
	slowDial := func(ctx context.Context, network, a string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, a)
		time.Sleep(20 * time.Millisecond)
		return c, err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: slowDial},
		Timeout: 10 * time.Second}
	for i := range 20 {
		resp, err := client.Get("http://" + addr + "/")
		if err != nil {
			t.Fatalf("try %d: %v, want a 503", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("try %d: %d %v, want a 503 with Retry-After", i, resp.StatusCode, resp.Header)
		}
	}
}
