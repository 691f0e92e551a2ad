package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `up` creates the NATS credentials at first start, private to its user, and keeps them; files
// an older version left readable by others are made private.
func TestNATSCredentials(t *testing.T) {
	state := t.TempDir()
	user, password, err := natsCredentials(state)
	if err != nil {
		t.Fatal(err)
	}
	if user != "faas-gpu" || len(password) != 64 {
		t.Fatalf("credentials %q / %d characters, want faas-gpu and a 64-character password", user, len(password))
	}
	mode := func(p string) os.FileMode {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	secrets := filepath.Join(state, "secrets")
	if m := mode(secrets); m != 0o700 {
		t.Errorf("%s: mode %v, want 0700", secrets, m)
	}
	for _, f := range []string{"nats-user", "nats-password"} {
		if m := mode(filepath.Join(secrets, f)); m != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, m)
		}
	}
	if err := os.Chmod(secrets, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(secrets, "nats-password"), 0o644); err != nil {
		t.Fatal(err)
	}
	user2, password2, err := natsCredentials(state)
	if err != nil || user2 != user || password2 != password {
		t.Fatalf("second start: %q %q %v, want the same credentials", user2, password2, err)
	}
	if m := mode(secrets); m != 0o700 {
		t.Errorf("second start left %s at %v", secrets, m)
	}
	if m := mode(filepath.Join(secrets, "nats-password")); m != 0o600 {
		t.Errorf("second start left nats-password at %v", m)
	}
	url := filepath.Join(state, natsURLFile)
	if err := os.WriteFile(url, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeFilePrivate(url, []byte("nats://u:p@127.0.0.1:1\n")); err != nil {
		t.Fatal(err)
	}
	if m := mode(url); m != 0o600 {
		t.Errorf("nats-url rewritten with mode %v, want 0600", m)
	}
	if err := os.WriteFile(filepath.Join(secrets, "nats-password"), []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := natsCredentials(state); err == nil {
		t.Error("an empty password file was accepted")
	}
}

func TestUpQueueFlagsNameTheFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"faas-gpu", "up", "--state-dir", t.TempDir(), "--dead-letter-max-age", "1ms"}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "-dead-letter-max-age") {
		t.Fatalf("exit %d, stderr %q; want 2 naming -dead-letter-max-age", code, stderr.String())
	}
}

// Callbacks may not reach the addresses the queue-worker command itself talks to.
func TestQueueWorkerForbiddenCallbackHosts(t *testing.T) {
	c := queueWorkerConfig{forbidCallbacks: "provider.openfaas:8081, ", functionsURL: "https://gw.example",
		gpuserverURL: "http://10.0.0.5:8090"}
	got := strings.Join(c.forbiddenCallbackHosts(), ",")
	if got != "provider.openfaas:8081,gw.example:443,10.0.0.5:8090" {
		t.Fatalf("forbidden callback hosts %q", got)
	}
}
