package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/faas-gpu/faas-gpu/queueworker/frontdoor"
	"github.com/faas-gpu/faas-gpu/queueworker/natsserver"
)

func TestQueueWorkerBadFlagsNameTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--nats-url", ""}, want: "-nats-url"},
		{args: []string{"--gateway-url", "ftp://x"}, want: "-gateway-url"},
		{args: []string{"--max-inflight", "-3"}, want: "-max-inflight"},
		{args: []string{"--ack-wait", "1ms"}, want: "-ack-wait"},
		{args: []string{"--ack-wait", "soon"}, want: "-ack-wait"},
		{args: []string{"--order", "random"}, want: "-order"},
		{args: []string{"--queues", "a.b"}, want: "-queues"},
		{args: []string{"--max-attempts", "0"}, want: "-max-attempts"},
		{args: []string{"--retry-initial", "1s", "--retry-max", "10ms"}, want: "-retry-max"},
		{args: []string{"--metrics-addr", "nowhere"}, want: "-metrics-addr"},
		{args: []string{"--frontdoor-addr", "nowhere"}, want: "-frontdoor-addr"},
		{args: []string{"--functions-url", "nope"}, want: "-functions-url"},
		{args: []string{"--basic-auth-user", "admin"}, want: "-basic-auth-password-file"},
		{args: []string{"--basic-auth-user", "admin", "--basic-auth-password-file", "/does/not/exist"}, want: "-basic-auth-password-file"},
		{args: []string{"--gpuserver-url", "http://a:1", "--gpuserver-socket", "/x"}, want: "-gpuserver-url"},
		{args: []string{"--queues", "faas-dead-letter"}, want: "-queues"},
		{args: []string{"--nats-password-file", "/does/not/exist"}, want: "-nats-password-file"},
		{args: []string{"--nats-user", "", "--nats-password-file", "/x"}, want: "-nats-user"},
		{args: []string{"--dead-letter-max-age", "1ms"}, want: "-dead-letter-max-age"},
		{args: []string{"--forbidden-callback-hosts", "nope"}, want: "-forbidden-callback-hosts"},
		{env: map[string]string{"FAAS_GPU_MAX_INFLIGHT": "many"}, want: "FAAS_GPU_MAX_INFLIGHT"},
		{env: map[string]string{"FAAS_GPU_ACK_WAIT": "1ms"}, want: "-ack-wait"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"faas-gpu", "queue-worker"}, tc.args...), &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("%v %v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, tc.env, code, stderr.String(), tc.want)
			}
		})
	}
}

// The command consumes, invokes through the gateway, calls back, serves metrics, and drains on cancel. The call is
// the one faas-cli makes (POST /async-function/echo.openfaas-fn), to the command's own front door;
// the gateway protects /system/* with basic auth, and those credentials reach neither the function nor the
// callback.
func TestQueueWorkerCommandRuns(t *testing.T) {
	ns, err := natsserver.Start(context.Background(), natsserver.Config{StoreDir: t.TempDir(), Port: -1,
		Username: "faas-gpu", Password: "qw-secret"})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/system/") {
			if u, p, ok := r.BasicAuth(); !ok || u != "admin" || p != "gw-secret" {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
		}
		switch {
		case r.URL.Path == "/system/namespaces":
			_, _ = io.WriteString(w, `["openfaas-fn"]`)
		case r.URL.Path == "/system/functions":
			_, _ = io.WriteString(w, `[{"name":"echo","namespace":"openfaas-fn","annotations":{"com.openfaas.gpu.slo":"1s"}}]`)
		case r.URL.Path == "/function/echo.openfaas-fn":
			w.Header().Set("X-Function-Saw-Authorization", r.Header.Get("Authorization"))
			_, _ = io.Copy(w, r.Body)
		default:
			http.NotFound(w, r)
		}
	}))
	defer gw.Close()
	got := make(chan string, 1)
	cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r.Header.Get("X-Function-Status") + " " + string(b) + " auth=" + r.Header.Get("Authorization") +
			r.Header.Get("X-Function-Saw-Authorization")
	}))
	defer cb.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	frontAddr := l.Addr().String()
	l.Close()
	passFile := filepath.Join(t.TempDir(), "nats-password")
	if err := os.WriteFile(passFile, []byte("qw-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gwPassFile := filepath.Join(t.TempDir(), "basic-auth-password")
	if err := os.WriteFile(gwPassFile, []byte("gw-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	go func() {
		done <- runQueueWorker(ctx, []string{"--nats-url", ns.ClientURL(), "--nats-password-file", passFile, "--gateway-url", gw.URL,
			"--basic-auth-user", "admin", "--basic-auth-password-file", gwPassFile,
			"--metrics-addr", "127.0.0.1:0", "--frontdoor-addr", frontAddr, "--log-level", "warn"}, &stdout, &stderr)
	}()
	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo("faas-gpu", "qw-secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := frontdoor.EnsureStreams(ctx, js); err != nil {
		t.Fatal(err)
	}
	// The command's own front door (-frontdoor-addr) takes the call.
	deadline := time.Now().Add(20 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodPost, "http://"+frontAddr+"/async-function/echo.openfaas-fn", strings.NewReader("hi"))
		req.Header.Set("X-Callback-Url", cb.URL)
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
			if res.StatusCode != http.StatusAccepted {
				t.Fatalf("front door answered %d", res.StatusCode)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("front door on %s not reachable: %v", frontAddr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case s := <-got:
		if s != "200 hi auth=" {
			t.Fatalf("callback %q", s)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no callback; stderr %s", stderr.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("runQueueWorker: %v (stderr %s)", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "metrics on http://127.0.0.1:") {
		t.Fatalf("stdout %q", stdout.String())
	}
}
