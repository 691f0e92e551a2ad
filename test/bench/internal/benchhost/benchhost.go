// Package benchhost is what the data-plane benches (test/bench/swap, test/bench/scratch, ...) share about the
// machine they run on: the device they measure (the real GPUs or the simulated node in its timed mode), a
// directory in memory for their files, and the CPU model written next to their figures.
package benchhost

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/sim"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// Device is a bench's device and the words its report uses for it.
type Device struct {
	Backend device.Backend
	// Desc names the device: "cuda: <GPU> xN", or the simulated node, its GPU and its time scale.
	Desc string
	// TimeScale is what the figures are divided by: the sim's delay multiplier, 1 on a real GPU.
	TimeScale float64
}

// OpenDevice opens kind "cuda" (the real GPUs; timeScale and flops are ignored) or "sim" (the simulated node
// named by node, its delays multiplied by timeScale, kernels at flops, 0 for the sim's default). An unknown node
// is an error naming -node.
func OpenDevice(kind, node string, timeScale, flops float64) (Device, error) {
	if kind == "cuda" {
		b, err := cuda.Open("")
		if err != nil {
			return Device{}, err
		}
		return Device{Backend: b, Desc: fmt.Sprintf("cuda: %s x%d", b.GPUs()[0].Name, len(b.GPUs())),
			TimeScale: 1}, nil
	}
	n, err := topology.Resolve(node)
	if err != nil {
		return Device{}, fmt.Errorf("-node: %w", err)
	}
	b, err := sim.New(sim.Options{Node: n, TimeScale: timeScale, FLOPS: flops})
	if err != nil {
		return Device{}, err
	}
	return Device{Backend: b, Desc: fmt.Sprintf("sim: %s (%s), delays x%g, figures in modelled time", n.Name,
		n.GPUs[0].Name, timeScale), TimeScale: timeScale}, nil
}

// ShmDir is /dev/shm where there is one (files in memory), else the system's temporary directory.
func ShmDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// CPUModel is the host's CPU model from /proc/cpuinfo, "unknown CPU" where it cannot be read.
func CPUModel() string {
	raw, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "model name") {
			if _, v, ok := strings.Cut(l, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return "unknown CPU"
}

// LoadAvg is /proc/loadavg's three load averages and its runnable/total tasks ("1.02 0.98 0.91 2/310"),
// "unknown" where it cannot be read.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return "unknown"
	}
	return strings.Join(f[:4], " ")
}

// Commit is `git describe --always --dirty` of the working directory's tree, "unknown" outside a git tree.
func Commit() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
