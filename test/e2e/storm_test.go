package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// storm holds as many stalled connections from one loopback source address to addr as it can until stopped: each
// sends the start of a request and nothing more (slowloris); a connection the server closes (refused, or its
// header timeout) is opened again.
type storm struct {
	stop   chan struct{}
	wg     sync.WaitGroup
	opened atomic.Int64
}

func startStorm(src, addr string, conns int, payload string) *storm {
	s := &storm{stop: make(chan struct{})}
	for i := 0; i < conns; i++ {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
			for {
				select {
				case <-s.stop:
					return
				default:
				}
				c, err := d.Dial("tcp", addr)
				if err != nil {
					select {
					case <-s.stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					continue
				}
				s.opened.Add(1)
				_, _ = io.WriteString(c, payload)
				done := make(chan struct{})
				go func() { _, _ = io.Copy(io.Discard, c); close(done) }() // returns once the server closes it
				select {
				case <-s.stop:
					c.Close()
					<-done
					return
				case <-done: // refused or timed out: come back a little later, as a client retrying would
					c.Close()
					select {
					case <-s.stop:
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
		}()
	}
	return s
}

func (s *storm) end() {
	close(s.stop)
	s.wg.Wait()
}

// clientFrom is an HTTP client whose connections come from src (a loopback address of its own: another peer).
func clientFrom(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 20 * time.Second,
		Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true, Proxy: nil}}
}

func post(c *http.Client, u, body string, header map[string]string) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw), nil
}

func openFiles(pid int) int {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(entries)
}

// TestUpSurvivesConnectionStorms runs `faas-gpu up` with 1024 open files and storms its gateway from three peers
// (1200 stalled connections) and its NATS port (400 connections that never authenticate) at once. Each surface
// keeps its bounds (the gateway at most its share, a peer at most a quarter of it, NATS its own), so up never runs
// out of descriptors: during the storm another peer's synchronous and asynchronous calls are answered, the
// asynchronous call's callback arrives, and the gpuserver answers; after it, the stormed peers are served again
// without a restart.
func TestUpSurvivesConnectionStorms(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: runs faas-gpu up and a python function")
	}
	const nofile = 1024
	dir := t.TempDir()
	in := startUpUnder(t, filepath.Join(dir, "state"),
		[]string{"sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, nofile)})
	upPID := in.cmd.Process.Pid
	deploy(t, in, types.FunctionDeployment{Service: "echo", Image: "echo:latest"})
	invokeReady(t, in.url+"/function/echo", "ready")

	var callbacks atomic.Int64
	cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Function-Status") == "200" {
			callbacks.Add(1)
		}
	}))
	defer cb.Close()
	natsURL, err := os.ReadFile(filepath.Join(in.stateDir, "nats-url"))
	if err != nil {
		t.Fatal(err)
	}
	nu, err := url.Parse(strings.TrimSpace(string(natsURL)))
	if err != nil {
		t.Fatal(err)
	}
	gateway := strings.TrimPrefix(in.url, "http://")
	slowloris := "POST /function/echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n"
	var storms []*storm
	for _, src := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.5"} {
		storms = append(storms, startStorm(src, gateway, 400, slowloris))
	}
	storms = append(storms, startStorm("127.0.0.6", nu.Host, 400, "")) // NATS: connect, never authenticate
	defer func() {
		for _, s := range storms {
			select {
			case <-s.stop:
			default:
				s.end()
			}
		}
	}()
	// The storm is on once every storm has had thousands of connections refused or closed.
	testkit.EventuallyNil(t, 60*time.Second, "the storm to build up", func() error {
		for i, s := range storms {
			if n := s.opened.Load(); n < 600 {
				return fmt.Errorf("storm %d opened %d connections", i, n)
			}
		}
		return nil
	})
	peer := clientFrom("127.0.0.4")
	gs := upGPUServer(t, in.stateDir)
	maxFiles := 0
	const calls = 5
	for i := 0; i < calls; i++ {
		if n := openFiles(upPID); n > maxFiles {
			maxFiles = n
		}
		code, body, err := post(peer, in.url+"/function/echo", "during", nil)
		if err != nil || code != 200 || body != "during" {
			t.Errorf("echo from another peer during the storm: %d %q %v", code, body, err)
		}
		code, _, err = post(peer, in.url+"/async-function/echo", "async", map[string]string{"X-Callback-Url": cb.URL})
		if err != nil || code != http.StatusAccepted {
			t.Errorf("async echo from another peer during the storm: %d %v", code, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := gs.Status(ctx); err != nil {
			t.Errorf("the gpuserver during the storm: %v", err)
		}
		cancel()
	}
	testkit.EventuallyNil(t, 60*time.Second, "the callbacks of the calls made during the storm", func() error {
		if n := callbacks.Load(); n < calls {
			return fmt.Errorf("%d of %d callbacks", n, calls)
		}
		return nil
	})
	t.Logf("during the storm up held at most %d of its %d open files; storms opened %d, %d, %d (gateway) and %d (NATS) connections",
		maxFiles, nofile, storms[0].opened.Load(), storms[1].opened.Load(), storms[2].opened.Load(), storms[3].opened.Load())
	if maxFiles >= nofile-64 {
		t.Errorf("up held %d open files of %d during the storm: the bounds do not keep a reserve", maxFiles, nofile)
	}
	if !strings.Contains(in.out.String(), "refusing connections beyond the limit") {
		t.Error("up's log does not say it refused connections")
	}
	for _, s := range storms {
		s.end()
	}
	// Every surface recovers by itself: the stormed peers are served again.
	for _, src := range []string{"127.0.0.2", "127.0.0.3"} {
		c := clientFrom(src)
		testkit.EventuallyNil(t, 30*time.Second, "the gateway for "+src+" after the storm", func() error {
			code, body, err := post(c, in.url+"/function/echo", "after", nil)
			if err != nil || code != 200 || body != "after" {
				return fmt.Errorf("%d %q %v", code, body, err)
			}
			code, _, err = post(c, in.url+"/async-function/echo", "after", map[string]string{"X-Callback-Url": cb.URL})
			if err != nil || code != http.StatusAccepted {
				return fmt.Errorf("async: %d %v", code, err)
			}
			return nil
		})
	}
	testkit.EventuallyNil(t, 60*time.Second, "the callbacks after the storm", func() error {
		if n := callbacks.Load(); n < calls+2 {
			return fmt.Errorf("%d of %d callbacks", n, calls+2)
		}
		return nil
	})
}
