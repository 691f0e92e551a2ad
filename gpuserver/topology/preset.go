package topology

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

const (
	gb  = 1e9
	mib = 1 << 20
)

// PresetNames lists the names Preset accepts.
func PresetNames() []string {
	names := []string{"v100x4", "a100x8", "h100x8", "h200x1"}
	sort.Strings(names)
	return names
}

// Preset returns a built-in node description:
//
//   - v100x4: Torpor's node. 4x V100-SXM2 32 GB on PCIe Gen3 x16 (about 12 GB/s each); GPUs 0-1 and 2-3 share a
//     switch uplink of the same width; two concurrent host transfers behind one switch each take 1.64x as long
//     (Torpor Table 3, measured), not the 2x an evenly shared uplink would give; NVLink 2.0 between every pair, fast (2 links, 48 GB/s) for 0-3, 1-2, 2-3 and slow (1 link,
//     24 GB/s) for 0-1, 0-2, 1-3.
//   - a100x8: 8x A100-SXM4 80 GB, PCIe Gen4 (about 24 GB/s), two GPUs per switch, NVSwitch (about 240 GB/s
//     between any pair).
//   - h100x8: 8x H100-SXM5 80 GB, PCIe Gen5 (about 50 GB/s), two GPUs per switch, NVSwitch (about 360 GB/s).
//   - h200x1: one H200 141 GB on PCIe Gen5.
//
// Bandwidths are effective (achievable) figures, not link peaks.
func Preset(name string) (Node, error) {
	var n Node
	switch name {
	case "v100x4":
		n = uniform(name, 4, GPU{Name: "Tesla V100-SXM2-32GB", MemoryBytes: 32510 * mib, CopyEngines: 2,
			H2DBytesPerSec: 12 * gb, ComputeCapability: 70}, 12*gb, 2)
		fast, slow := 48*gb, 24*gb
		pairs := map[[2]int]float64{{0, 3}: fast, {1, 2}: fast, {2, 3}: fast, {0, 1}: slow, {0, 2}: slow, {1, 3}: slow}
		for p, bw := range pairs {
			n.NVLinkBytesPerSec[p[0]][p[1]] = bw
			n.NVLinkBytesPerSec[p[1]][p[0]] = bw
		}
		// Torpor measured 1.64x for two swaps behind one switch (Table 3: 25 ms alone, 41 ms contended), not
		// the 2x an evenly shared uplink gives.
		n.Slowdown = Slowdown{HostSameSwitch: 1.64, HostOtherSwitch: 1.05, NVLinkOtherPair: 1.05}
		n.TransferLatencySec = 20e-6
	case "a100x8":
		n = uniform(name, 8, GPU{Name: "NVIDIA A100-SXM4-80GB", MemoryBytes: 81920 * mib, CopyEngines: 4,
			H2DBytesPerSec: 24 * gb, ComputeCapability: 80}, 24*gb, 2)
		fullMesh(&n, 240*gb)
		n.Slowdown = Slowdown{HostOtherSwitch: 1.03, NVLinkOtherPair: 1}
		n.TransferLatencySec = 10e-6
	case "h100x8":
		n = uniform(name, 8, GPU{Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 81559 * mib, CopyEngines: 4,
			H2DBytesPerSec: 50 * gb, ComputeCapability: 90}, 50*gb, 2)
		fullMesh(&n, 360*gb)
		n.Slowdown = Slowdown{HostOtherSwitch: 1.03, NVLinkOtherPair: 1}
		n.TransferLatencySec = 10e-6
	case "h200x1":
		n = uniform(name, 1, GPU{Name: "NVIDIA H200", MemoryBytes: 143771 * mib, CopyEngines: 4,
			H2DBytesPerSec: 50 * gb, ComputeCapability: 90}, 50*gb, 1)
		n.Slowdown = Slowdown{HostOtherSwitch: 1, NVLinkOtherPair: 1}
		n.TransferLatencySec = 10e-6
	default:
		return Node{}, fmt.Errorf("%w: unknown preset %q (known: %s)", ErrInvalidNode, name,
			strings.Join(PresetNames(), ", "))
	}
	return n, n.Validate()
}

// uniform builds a node of count identical GPUs, perSwitch GPUs behind each switch.
func uniform(name string, count int, g GPU, uplink float64, perSwitch int) Node {
	n := Node{Name: name}
	for i := range count {
		g.PCIeSwitch = i / perSwitch
		n.GPUs = append(n.GPUs, g)
	}
	for range (count + perSwitch - 1) / perSwitch {
		n.SwitchUplinkBytesPerSec = append(n.SwitchUplinkBytesPerSec, uplink)
	}
	n.NVLinkBytesPerSec = make([][]float64, count)
	for i := range n.NVLinkBytesPerSec {
		n.NVLinkBytesPerSec[i] = make([]float64, count)
	}
	return n
}

func fullMesh(n *Node, bw float64) {
	for i := range n.NVLinkBytesPerSec {
		for j := range n.NVLinkBytesPerSec[i] {
			if i != j {
				n.NVLinkBytesPerSec[i][j] = bw
			}
		}
	}
}

// Load reads a node description from a JSON or YAML file (the fields of Node) and validates it.
func Load(path string) (Node, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Node{}, fmt.Errorf("read node file: %w", err)
	}
	return Parse(data)
}

// Parse reads a node description from JSON or YAML bytes and validates it. Unknown fields are refused.
func Parse(data []byte) (Node, error) {
	var n Node
	if err := yaml.UnmarshalStrict(data, &n); err != nil {
		return Node{}, fmt.Errorf("%w: %w", ErrInvalidNode, err)
	}
	if n.Slowdown.HostOtherSwitch == 0 {
		n.Slowdown.HostOtherSwitch = 1
	}
	if n.Slowdown.NVLinkOtherPair == 0 {
		n.Slowdown.NVLinkOtherPair = 1
	}
	if err := n.Validate(); err != nil {
		return Node{}, err
	}
	return n, nil
}

// Resolve returns the preset called nameOrPath, or else loads the file at that path.
func Resolve(nameOrPath string) (Node, error) {
	for _, p := range PresetNames() {
		if p == nameOrPath {
			return Preset(p)
		}
	}
	if _, err := os.Stat(nameOrPath); err != nil {
		return Node{}, fmt.Errorf("%w: %q is neither a preset (%s) nor a readable file", ErrInvalidNode, nameOrPath,
			strings.Join(PresetNames(), ", "))
	}
	return Load(nameOrPath)
}
