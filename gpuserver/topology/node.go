// Package topology describes a GPU node: its GPUs (memory, PCIe switch, copy engines), the host-to-device and
// switch-uplink bandwidths, the NVLink bandwidth matrix and how concurrent transfers slow each other down. It also
// holds the one link model (TransferTime) that both the simulated device and the policy simulator use, so the time
// to move bytes is computed in exactly one place.
//
// Nodes come from a preset (Preset: v100x4, a100x8, h100x8, h200x1) or from a JSON/YAML file (Load). Validate
// names the first bad field. WithGPUMemory overrides every GPU's memory (the --gpu-memory flag); ParseSize reads
// sizes such as "1536Mi", "32Gi" or "16GB".
package topology

import (
	"errors"
	"fmt"
	"math"
)

// Host is the endpoint index of host memory in a Path.
const Host = -1

// ErrInvalidNode is wrapped by every validation error; the message names the bad field.
var ErrInvalidNode = errors.New("invalid node")

// GPU is one device of the node.
type GPU struct {
	// Name is the device's model name, e.g. "Tesla V100-SXM2-32GB".
	Name string `json:"name"`
	// MemoryBytes is the device memory available to functions.
	MemoryBytes uint64 `json:"memory_bytes"`
	// PCIeSwitch is the id of the PCIe switch the GPU sits behind; GPUs with the same id share its uplink.
	PCIeSwitch int `json:"pcie_switch"`
	// CopyEngines is the number of DMA engines: that many inbound transfers run at full speed at once.
	CopyEngines int `json:"copy_engines"`
	// H2DBytesPerSec is the GPU's own PCIe link bandwidth from host memory, in bytes per second.
	H2DBytesPerSec float64 `json:"h2d_bytes_per_sec"`
	// ComputeCapability is the GPU's architecture as major*10+minor (70 for a V100, 90 for an H100); a simulated
	// GPU runs the module code compiled for it. 0: unknown (the simulator assumes 70).
	ComputeCapability int `json:"compute_capability,omitempty"`
}

// Slowdown holds the interference factors of concurrent transfers (after Torpor Table 3). Bandwidth sharing on a
// common link (a switch uplink, one NVLink pair, a GPU's copy engines) is modelled by dividing the link's bandwidth
// among the transfers on it; these factors add the interference that sharing alone does not explain.
type Slowdown struct {
	// HostSameSwitch, when set (>= 1), states the contended slowdown of host-to-device transfers behind one switch
	// as measured, the way Torpor's Table 3 does (ResNet-152 swapped in over PCIe: 25 ms alone, 41 ms beside a
	// second swap behind the same switch): it multiplies a host transfer's time once per concurrent host transfer
	// behind the same switch, in place of dividing the switch uplink among them. 0 (the default) derives the
	// slowdown from the uplink's bandwidth.
	HostSameSwitch float64 `json:"host_same_switch,omitempty"`
	// HostOtherSwitch multiplies a host-to-device transfer's time once per concurrent host transfer behind another
	// switch (host memory and root-complex contention); 1 means none.
	HostOtherSwitch float64 `json:"host_other_switch"`
	// NVLinkOtherPair multiplies a GPU-to-GPU transfer's time once per concurrent NVLink transfer on another pair
	// that touches one of its two GPUs; 1 means none.
	NVLinkOtherPair float64 `json:"nvlink_other_pair"`
}

// Node is one machine's GPUs and links.
type Node struct {
	// Name of the node description, e.g. "v100x4".
	Name string `json:"name"`
	// GPUs of the node, indexed from 0.
	GPUs []GPU `json:"gpus"`
	// SwitchUplinkBytesPerSec is each PCIe switch's uplink bandwidth to the host, indexed by switch id.
	SwitchUplinkBytesPerSec []float64 `json:"switch_uplink_bytes_per_sec"`
	// NVLinkBytesPerSec[i][j] is the direct GPU i -> GPU j bandwidth; 0 means no NVLink (peer copies then go
	// through host memory over PCIe). It must be square with a zero diagonal.
	NVLinkBytesPerSec [][]float64 `json:"nvlink_bytes_per_sec"`
	// Slowdown of concurrent transfers.
	Slowdown Slowdown `json:"slowdown"`
	// TransferLatencySec is a fixed set-up cost per transfer, in seconds.
	TransferLatencySec float64 `json:"transfer_latency_sec"`
}

// Validate checks the node and returns an error wrapping ErrInvalidNode that names the first bad field.
func (n *Node) Validate() error {
	bad := func(field, format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidNode, field, fmt.Sprintf(format, a...))
	}
	if n.Name == "" {
		return bad("name", "must not be empty")
	}
	if len(n.GPUs) == 0 {
		return bad("gpus", "at least one GPU is required")
	}
	for i, g := range n.GPUs {
		f := func(s string) string { return fmt.Sprintf("gpus[%d].%s", i, s) }
		switch {
		case g.Name == "":
			return bad(f("name"), "must not be empty")
		case g.MemoryBytes == 0:
			return bad(f("memory_bytes"), "must be > 0")
		case g.PCIeSwitch < 0 || g.PCIeSwitch >= len(n.SwitchUplinkBytesPerSec):
			return bad(f("pcie_switch"), "%d is not an index of switch_uplink_bytes_per_sec (%d switches)",
				g.PCIeSwitch, len(n.SwitchUplinkBytesPerSec))
		case g.CopyEngines <= 0:
			return bad(f("copy_engines"), "must be > 0")
		case !positive(g.H2DBytesPerSec):
			return bad(f("h2d_bytes_per_sec"), "must be > 0")
		case g.ComputeCapability != 0 && (g.ComputeCapability < 30 || g.ComputeCapability > 255):
			return bad(f("compute_capability"), "%d: want major*10+minor, e.g. 90 (or 0: unknown)",
				g.ComputeCapability)
		}
	}
	for s, bw := range n.SwitchUplinkBytesPerSec {
		if !positive(bw) {
			return bad(fmt.Sprintf("switch_uplink_bytes_per_sec[%d]", s), "must be > 0")
		}
	}
	if len(n.NVLinkBytesPerSec) != 0 {
		if len(n.NVLinkBytesPerSec) != len(n.GPUs) {
			return bad("nvlink_bytes_per_sec", "must have %d rows (one per GPU), has %d", len(n.GPUs),
				len(n.NVLinkBytesPerSec))
		}
		for i, row := range n.NVLinkBytesPerSec {
			if len(row) != len(n.GPUs) {
				return bad(fmt.Sprintf("nvlink_bytes_per_sec[%d]", i), "must have %d columns, has %d",
					len(n.GPUs), len(row))
			}
			for j, bw := range row {
				if bw < 0 || math.IsNaN(bw) || math.IsInf(bw, 0) || (i == j && bw != 0) {
					return bad(fmt.Sprintf("nvlink_bytes_per_sec[%d][%d]", i, j),
						"must be finite, >= 0 and 0 on the diagonal")
				}
			}
		}
	}
	if n.Slowdown.HostOtherSwitch < 1 || math.IsInf(n.Slowdown.HostOtherSwitch, 0) {
		return bad("slowdown.host_other_switch", "must be >= 1")
	}
	if hs := n.Slowdown.HostSameSwitch; hs != 0 && (hs < 1 || math.IsInf(hs, 0) || math.IsNaN(hs)) {
		return bad("slowdown.host_same_switch", "must be 0 (derived from the uplink) or >= 1")
	}
	if n.Slowdown.NVLinkOtherPair < 1 || math.IsInf(n.Slowdown.NVLinkOtherPair, 0) {
		return bad("slowdown.nvlink_other_pair", "must be >= 1")
	}
	if n.TransferLatencySec < 0 || math.IsNaN(n.TransferLatencySec) || math.IsInf(n.TransferLatencySec, 0) {
		return bad("transfer_latency_sec", "must be >= 0")
	}
	return nil
}

func positive(f float64) bool { return f > 0 && !math.IsInf(f, 0) && !math.IsNaN(f) }

// NVLink returns the direct bandwidth from GPU i to GPU j in bytes per second, 0 if there is no NVLink.
func (n *Node) NVLink(i, j int) float64 {
	if len(n.NVLinkBytesPerSec) == 0 || i < 0 || j < 0 || i >= len(n.GPUs) || j >= len(n.GPUs) {
		return 0
	}
	return n.NVLinkBytesPerSec[i][j]
}

// TotalMemory is the sum of all GPUs' memory.
func (n *Node) TotalMemory() uint64 {
	var t uint64
	for _, g := range n.GPUs {
		t += g.MemoryBytes
	}
	return t
}

// MaxGPUMemory is the memory of the largest GPU.
func (n *Node) MaxGPUMemory() uint64 {
	var m uint64
	for _, g := range n.GPUs {
		m = max(m, g.MemoryBytes)
	}
	return m
}

// SameSwitch reports whether GPUs i and j sit behind the same PCIe switch.
func (n *Node) SameSwitch(i, j int) bool { return n.GPUs[i].PCIeSwitch == n.GPUs[j].PCIeSwitch }

// WithGPUMemory returns a copy of the node in which every GPU has the given memory (the --gpu-memory flag).
func (n Node) WithGPUMemory(bytes uint64) (Node, error) {
	if bytes == 0 {
		return Node{}, fmt.Errorf("%w: gpu memory: must be > 0", ErrInvalidNode)
	}
	out := n.Clone()
	for i := range out.GPUs {
		out.GPUs[i].MemoryBytes = bytes
	}
	return out, nil
}

// Clone returns a deep copy of the node.
func (n Node) Clone() Node {
	out := n
	out.GPUs = append([]GPU(nil), n.GPUs...)
	out.SwitchUplinkBytesPerSec = append([]float64(nil), n.SwitchUplinkBytesPerSec...)
	if n.NVLinkBytesPerSec != nil {
		out.NVLinkBytesPerSec = make([][]float64, len(n.NVLinkBytesPerSec))
		for i, row := range n.NVLinkBytesPerSec {
			out.NVLinkBytesPerSec[i] = append([]float64(nil), row...)
		}
	}
	return out
}
