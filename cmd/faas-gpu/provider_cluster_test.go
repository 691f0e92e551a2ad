package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/provider/knative"
	"github.com/faas-gpu/faas-gpu/provider/kubernetes"
)

func writeKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:1
contexts:
- name: test
  context: {cluster: test, user: test}
current-context: test
users:
- name: test
  user: {token: t}
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestClusterBackends(t *testing.T) {
	kc := writeKubeconfig(t)
	for _, kind := range []string{"kubernetes", "knative"} {
		fs := flag.NewFlagSet("provider", flag.ContinueOnError)
		cfg := registerClusterFlags(fs)
		if err := parseFlags(fs, []string{"-kubeconfig", kc, "-node-label", "gpu=yes", "-function-namespace", "fn"}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		b, err := newClusterBackend(ctx, kind, cfg)
		if err != nil {
			cancel()
			t.Fatalf("%s: %v", kind, err)
		}
		if b.Functions == nil || b.Secrets == nil || b.Logs == nil || b.Close == nil {
			cancel()
			t.Fatalf("%s: incomplete backends %+v", kind, b)
		}
		switch f := b.Functions.(type) {
		case *kubernetes.Backend:
			if c := f.Config(); c.GPU.NodeLabelKey != "gpu" || c.GPU.NodeLabelValue != "yes" || c.DefaultNamespace != "fn" {
				t.Errorf("config %+v", c)
			}
			if err := f.Start(ctx); err == nil {
				t.Error("kubernetes backend: Start succeeded again, want newClusterBackend to have started its informers")
			}
		case *knative.Backend:
			if kind != "knative" {
				t.Errorf("%s built a knative backend", kind)
			}
		}
		// The informers retry against the unreachable API server until Close stops them under its deadline.
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := b.Close(cctx); err != nil {
			t.Errorf("%s: close: %v", kind, err)
		}
		ccancel()
		cancel()
	}
}

func TestClusterFlagErrors(t *testing.T) {
	kc := writeKubeconfig(t)
	cases := map[string][]string{
		"-node-label":           {"-node-label", "gpu"},
		"-image-pull-policy":    {"-image-pull-policy", "Sometimes"},
		"-shim-path":            {"-shim-path", "relative/libcuda.so.1"},
		"-socket-dir":           {"-socket-dir", "/var/../run"},
		"-function-namespace":   {"-function-namespace", "Bad_NS"},
		"-remoting-socket-name": {"-remoting-socket-name", "a/b"},
		"-kubeconfig":           {"-kubeconfig", filepath.Join(t.TempDir(), "missing")},
		"-backend":              {},
	}
	for flagName, args := range cases {
		fs := flag.NewFlagSet("provider", flag.ContinueOnError)
		cfg := registerClusterFlags(fs)
		if flagName != "-kubeconfig" {
			args = append(args, "-kubeconfig", kc)
		}
		if err := parseFlags(fs, args); err != nil {
			t.Fatal(err)
		}
		kind := "kubernetes"
		if flagName == "-backend" {
			kind = "nomad"
		}
		_, err := newClusterBackend(context.Background(), kind, cfg)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), flagName) {
			t.Errorf("%s: %v, want a usage error naming the flag", flagName, err)
		}
	}
}

func TestClusterFaasNetesEnvironment(t *testing.T) {
	t.Setenv("function_namespace", "team-fn")
	t.Setenv("image_pull_policy", "IfNotPresent")
	t.Setenv("http_probe", "false")
	fs := flag.NewFlagSet("provider", flag.ContinueOnError)
	cfg := registerClusterFlags(fs)
	if err := parseFlags(fs, nil); err != nil {
		t.Fatal(err)
	}
	c, err := cfg.config()
	if err != nil {
		t.Fatal(err)
	}
	if c.DefaultNamespace != "team-fn" || c.ImagePullPolicy != "IfNotPresent" || c.HTTPProbe {
		t.Errorf("faas-netes environment ignored: %+v", c)
	}
	t.Setenv("http_probe", "maybe")
	fs = flag.NewFlagSet("provider", flag.ContinueOnError)
	cfg = registerClusterFlags(fs)
	if _, err := cfg.config(); err == nil || !strings.Contains(err.Error(), "http_probe") {
		t.Errorf("bad http_probe: %v", err)
	}
}
