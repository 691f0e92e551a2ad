package server

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/client"
	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
	"github.com/faas-gpu/faas-gpu/test/testkit"
)

// TestSimKernelsDryIsAnnounced: a gpuserver whose simulated GPUs run kernels dry says so in its log, in the pool
// status (with the launches it did not execute) and in /metrics; the default says "reference"; a real device
// refuses dry mode.
func TestSimKernelsDryIsAnnounced(t *testing.T) {
	node, err := topology.Preset("h100x8")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []sim.KernelMode{sim.KernelsReference, sim.KernelsDry} {
		dir := t.TempDir()
		var logs testkit.Buffer
		s, err := Start(context.Background(), Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
			RemotingSocket: filepath.Join(dir, "remoting.sock"), KeyFile: filepath.Join(dir, "key"),
			DeviceReserveBytes: 64 << 20, SimKernels: mode, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		// one launch of a kernel the sim cannot compute, straight on the device
		m, err := s.dev.LoadModule(0, []byte(".version 9.0\n.visible .entry _Z4stepPf(.param .u64 p)\n{\n\tret;\n}\n"))
		if err != nil {
			t.Fatal(err)
		}
		f, _ := m.Function("_Z4stepPf")
		st, _ := s.dev.NewStream(0)
		launchErr := st.Launch(f, device.Dim3{X: 1}, device.Dim3{X: 1}, 0, make([]byte, 8))
		if err := st.Synchronize(context.Background()); err != nil {
			t.Fatal(err)
		}
		_ = st.Destroy()

		status, err := client.New(s.Socket(), client.WithToken(s.AdminToken())).Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		metrics := scrape(t, s)
		warned := strings.Contains(logs.String(), "dry kernel mode")
		switch mode {
		case sim.KernelsDry:
			if launchErr != nil || status.SimKernels != "dry" || status.SimDryLaunches != 1 || !warned ||
				!strings.Contains(metrics, "faas_gpu_sim_kernels_dry 1") ||
				!strings.Contains(metrics, "faas_gpu_sim_dry_launches_total 1") {
				t.Errorf("dry: launch %v, status %q %d, warned %v, metrics:\n%s", launchErr, status.SimKernels,
					status.SimDryLaunches, warned, grep(metrics, "faas_gpu_sim"))
			}
		default:
			if launchErr == nil || status.SimKernels != "reference" || status.SimDryLaunches != 0 || warned ||
				!strings.Contains(metrics, "faas_gpu_sim_kernels_dry 0") {
				t.Errorf("reference: launch %v, status %q %d, warned %v, metrics:\n%s", launchErr, status.SimKernels,
					status.SimDryLaunches, warned, grep(metrics, "faas_gpu_sim"))
			}
		}
		stop(t, s)
	}
	dev, err := sim.New(sim.Options{Node: node}) // stands in for a real device, which the server owns
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := Start(context.Background(), Config{Socket: filepath.Join(dir, "gpuserver.sock"), Node: node,
		Device: dev, SimKernels: sim.KernelsDry}); err == nil || !strings.Contains(err.Error(), "dry") {
		t.Fatalf("dry mode with a device given: %v", err)
	}
}
