package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/server"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// TestFunctionTokenMatchesTheGPUServer pins the standalone provider's token derivation to the gpuserver's: a GPU
// function the provider starts must pass the remoting hello with the token the provider computed from the key file.
func TestFunctionTokenMatchesTheGPUServer(t *testing.T) {
	dir, err := os.MkdirTemp("", "tok") // short: Unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	node, err := topology.Preset("v100x4")
	if err != nil {
		t.Fatal(err)
	}
	node, err = node.WithGPUMemory(1 << 30)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := filepath.Join(dir, "gpuserver.key")
	gs, err := server.Start(ctx, server.Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
		Policy: "fcfs", RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: key,
		RepositoryDir: filepath.Join(dir, "repository"), DeviceReserveBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer gs.Shutdown(context.Background())
	raw, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	for _, fn := range []string{"vector-add", "mlp", "hello-gpu.team"} {
		if got, want := functionToken(raw, fn), gs.Token(fn); got != want || want == "" {
			t.Errorf("token of %s: provider %q, gpuserver %q", fn, got, want)
		}
	}
}
