package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/provider/basicauth"
)

func TestProviderBadSettingsNameThem(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--backend", "nomad"}, want: "-backend"},
		{args: []string{"--port", "70000"}, want: "-port"},
		{args: []string{"--state-dir", ""}, want: "-state-dir"},
		{args: []string{"--proxy-timeout", "soon"}, want: "-proxy-timeout"},
		{env: map[string]string{"FAAS_GPU_PORT": "eighty"}, want: "FAAS_GPU_PORT"},
		{env: map[string]string{"FAAS_GPU_BACKEND": "nomad"}, want: "-backend"},
		{args: []string{"--ready-timeout", "0s"}, want: "-ready-timeout"},
		{args: []string{"--host", "example.com"}, want: "-host"},
		{args: []string{"--gpuserver-socket", "/tmp/x.sock"}, want: "-gpuserver-key-file"},
		{env: map[string]string{"basic_auth": "maybe"}, want: "basic_auth"},
		{env: map[string]string{"FAAS_GPU_SCALE_DOWN_WINDOW": "-40s"}, want: "-scale-down-window"},
	} {
		t.Run(strings.Join(tc.args, " ")+strings.Join(keys(tc.env), ""), func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"faas-gpu", "provider"}, tc.args...), &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want exit 2 naming %q", code, stderr.String(), tc.want)
			}
		})
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestProviderServesAndStops(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	t.Setenv("FAAS_GPU_STATE_DIR", filepath.Join(dir, "state")) // read from the environment
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- runProvider(ctx, []string{"--port", strconv.Itoa(port), "--build-dir", filepath.Join(dir, "build"),
			"--env-dir", filepath.Join(dir, "envs"), "--log-level", "error"}, io.Discard, io.Discard)
	}()
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	get := func(path string) (*http.Response, error) {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		if err != nil {
			return nil, err
		}
		// The credentials the local provider created at first start, in <state-dir>/secrets.
		creds, err := basicauth.Read(filepath.Join(dir, "state", "secrets"))
		if err != nil {
			return nil, err
		}
		req.SetBasicAuth(creds.User, creds.Password)
		return http.DefaultClient.Do(req)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := get("/system/info")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(body), `"orchestration":"local"`) {
				t.Fatalf("/system/info = %d %s", resp.StatusCode, body)
			}
			break
		}
		select {
		case err := <-done:
			t.Fatalf("provider exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("provider never answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := get("/system/namespaces")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// Without credentials: 401. With a Host that is not a loopback name (DNS rebinding): 403.
	resp, err = http.Get(base + "/system/functions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/system/functions without credentials: %d, want 401", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, base+"/healthz", nil)
	req.Host = "rebind.example:" + strconv.Itoa(port)
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("Host rebind.example: %d, want 403", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("provider stopped with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("provider did not stop")
	}
}
