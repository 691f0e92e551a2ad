package main

import (
	"bytes"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

func TestResolveGPUs(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	none := func() (topology.Node, device.Backend, error) {
		return topology.Node{}, nil, errors.New("nvml: device unavailable: init: library not found")
	}

	got, err := resolveGPUs(log, autoNode, "", none)
	// The fallback is a node the pinned CUDA 13 stack supports: compute capability 7.5 or later (a V100 is 7.0).
	if err != nil || got.Device != nil || len(got.Node.GPUs) != 8 || !strings.Contains(got.Node.Name, "h100") {
		t.Fatalf("auto without GPUs: %+v %v, want the simulated h100x8 node", got, err)
	}
	for _, g := range got.Node.GPUs {
		if g.ComputeCapability < 75 {
			t.Fatalf("the fallback node's GPU %s has compute capability %d: CUDA 13 needs 7.5 or later", g.Name,
				g.ComputeCapability)
		}
	}
	if !strings.Contains(logs.String(), "no NVIDIA GPU discovered") || !strings.Contains(logs.String(), "library not found") {
		t.Fatalf("auto without GPUs logged %q, want a warning with the cause", logs.String())
	}

	found, err := topology.Preset("h200x1")
	if err != nil {
		t.Fatal(err)
	}
	dev, err := sim.New(sim.Options{Node: found}) // stands in for the cuda backend
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Close(t.Context()) })
	discovered := func() (topology.Node, device.Backend, error) { return found, dev, nil }
	got, err = resolveGPUs(log, autoNode, "8Gi", discovered)
	if err != nil || got.Device != dev || len(got.Node.GPUs) != 1 || got.Node.GPUs[0].MemoryBytes != 8<<30 ||
		got.Reserve != 8<<30 {
		t.Fatalf("auto with a GPU and -gpu-memory 8Gi: %+v %v, want the discovered device, 8 GiB reserved", got, err)
	}

	called := false
	_, err = resolveGPUs(log, "v100x4", "lots", func() (topology.Node, device.Backend, error) {
		called = true
		return found, dev, nil
	})
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "-gpu-memory") || called {
		t.Fatalf("bad -gpu-memory: %v (discovery called: %v), want a usage error naming the flag", err, called)
	}
	if _, err := resolveGPUs(log, "nope", "", none); !errors.As(err, &ue) || !strings.Contains(err.Error(), "-gpus") {
		t.Fatalf("bad -gpus: %v, want a usage error naming the flag", err)
	}
}

func TestUpKeepsRealGPUImagesOnSharedMemory(t *testing.T) {
	state := t.TempDir()
	if got, want := repositoryDir(state, false), filepath.Join(state, "repository"); got != want {
		t.Errorf("simulated node: repository %s, want %s", got, want)
	}
	real := repositoryDir(state, true)
	if filepath.Dir(real) != "/dev/shm" || !strings.HasPrefix(filepath.Base(real), "faas-gpu-") {
		t.Errorf("real GPUs: repository %s, want /dev/shm/faas-gpu-<hash of the state dir>", real)
	}
	if again := repositoryDir(state, true); again != real {
		t.Errorf("a restart must find the same repository: %s then %s", real, again)
	}
	if other := repositoryDir(t.TempDir(), true); other == real {
		t.Errorf("two state dirs share the repository %s", real)
	}
}
