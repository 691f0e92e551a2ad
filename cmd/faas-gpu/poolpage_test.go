package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/ui"
	"github.com/faas-gpu/faas-gpu/provider/basicauth"
)

// TestGPUServerServesThePoolPage: `faas-gpu gpuserver -ui-addr` serves /ui behind the credentials of -ui-auth-dir
// (in a cluster the mounted basic-auth secret), bounds its connections per peer, and refuses -ui-addr without the
// credentials naming the flag.
func TestGPUServerServesThePoolPage(t *testing.T) {
	dir, err := os.MkdirTemp("", "gsui") // short: Unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	creds, _, err := basicauth.Ensure(filepath.Join(dir, "secrets"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	args := []string{"--socket", filepath.Join(dir, "gs.sock"), "--remoting-socket", "", "--key-file",
		filepath.Join(dir, "key"), "--repository-dir", filepath.Join(dir, "repo"), "--gpus", "h200x1"}

	var ue usageError
	if err := runGPUServer(context.Background(), append(args, "--ui-addr", addr), io.Discard, io.Discard); !errors.As(err, &ue) ||
		!strings.Contains(err.Error(), "-ui-auth-dir") {
		t.Fatalf("-ui-addr without -ui-auth-dir: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runGPUServer(ctx, append(args, "--ui-addr", addr, "--ui-auth-dir", filepath.Join(dir, "secrets")),
			io.Discard, io.Discard)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gpuserver: %v", err)
		}
	}()
	url := fmt.Sprintf("http://%s/ui/state", addr)
	var resp *http.Response
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.SetBasicAuth(creds.User, creds.Password)
		if resp, err = http.DefaultClient.Do(req); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer resp.Body.Close()
	var st ui.State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK || len(st.GPUs) != 1 ||
		st.Node != "h200x1" {
		t.Fatalf("/ui/state: %d %+v %v", resp.StatusCode, st, err)
	}
	anon, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	anon.Body.Close()
	if anon.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/ui/state without credentials: %d", anon.StatusCode)
	}

	// Bounded per peer: a peer holding its share of connections is refused the next one at once (503), and served
	// again once it lets them go.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	get := func() (int, error) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.SetBasicAuth(creds.User, creds.Password)
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for range poolPageMaxPerPeer {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	deadline = time.Now().Add(30 * time.Second)
	for code, err := get(); code != http.StatusServiceUnavailable; code, err = get() {
		if time.Now().After(deadline) {
			t.Fatalf("with %d connections held: %d %v, want 503", len(held), code, err)
		}
		time.Sleep(20 * time.Millisecond) // until the server has accepted the held ones
	}
	for _, c := range held {
		c.Close()
	}
	held = nil
	deadline = time.Now().Add(30 * time.Second)
	for code, err := get(); code != http.StatusOK; code, err = get() {
		if time.Now().After(deadline) {
			t.Fatalf("after the held connections closed: %d %v, want 200", code, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
