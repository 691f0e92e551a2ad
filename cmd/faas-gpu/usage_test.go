package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/metering"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/gpuserver/server"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/provider"
)

// TestUsageCommand: `faas-gpu usage` prints the bill of a running gpuserver per function and per namespace
// (-json too), and refuses a bad -since naming the flag. The gpuserver's read APIs take a credential: `usage` and
// `pool` derive the administrator's from the key in the state dir, where `up` keeps it, and see every function.
func TestUsageCommand(t *testing.T) {
	dir, err := os.MkdirTemp("", "usage") // short: Unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	node, err := topology.Preset(fallbackNode)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := server.Start(ctx, server.Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
		KeyFile: filepath.Join(dir, "gpuserver.key"), MeteringFile: filepath.Join(dir, "metering.json")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	admin := client.New(s.Socket(), client.WithToken(s.AdminToken()))
	for _, name := range []string{"resnet", "bert.dev"} {
		if err := admin.Register(ctx, pool.FunctionSpec{Name: name, MemoryBytes: 3 << 30}); err != nil {
			t.Fatal(err)
		}
		b, err := admin.Acquire(ctx, name, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if err := admin.Release(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}

	var out bytes.Buffer
	if err := runUsage(ctx, []string{"--state-dir", dir}, &out, nil); err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`(?m)^resnet\s+openfaas-fn\s+1\s+0\.\d{3}\s+\d+\.\d{3}\s+0\.000$`,
		`(?m)^bert\s+dev\s+1\s+0\.\d{3}`,
		`(?m)^NAMESPACE\s+REQUESTS`,
		`(?m)^dev\s+1\s`,
		`(?m)^openfaas-fn\s+1\s`,
	} {
		if !regexp.MustCompile(re).MatchString(out.String()) {
			t.Errorf("faas-gpu usage lacks %s:\n%s", re, out.String())
		}
	}
	t.Logf("faas-gpu usage:\n%s", out.String())
	out.Reset()
	if err := runUsage(ctx, []string{"--state-dir", dir, "--json", "--since", "1h"}, &out, nil); err != nil {
		t.Fatal(err)
	}
	var r metering.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil || len(r.Functions) != 2 || r.Since.After(time.Now()) {
		t.Fatalf("faas-gpu usage -json -since 1h: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := runPool(ctx, []string{"--state-dir", dir, "--nats-url", "none"}, &out, nil); err != nil ||
		!strings.Contains(out.String(), "resnet") || !strings.Contains(out.String(), "bert.dev") {
		t.Fatalf("faas-gpu pool with the state dir's key: %v\n%s", err, out.String())
	}
	var ue usageError
	if err := runUsage(ctx, []string{"--state-dir", dir, "--since", "yesterday"}, &out, nil); !errors.As(err, &ue) ||
		!regexp.MustCompile(`-since`).MatchString(err.Error()) {
		t.Fatalf("-since yesterday: %v, want a usage error naming -since", err)
	}
	if metering.DefaultNamespace != provider.DefaultNamespace {
		t.Fatalf("the bill's default namespace %q is not the provider's %q", metering.DefaultNamespace,
			provider.DefaultNamespace)
	}
}
