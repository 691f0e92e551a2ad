package topology

import (
	"fmt"
	"strings"
)

// Describe renders the node for people: one line per GPU (model, memory, compute capability, host link and PCIe
// switch), then its NVLinks: "all-to-all" with the one bandwidth when every pair has the same (an NVSwitch board,
// or a full mesh), else one line per GPU with its peers and their bandwidths, or "none". faas-gpu logs it when
// it starts on discovered GPUs, and the GPU suite prints it (TestDiscoverCUDA).
func (n *Node) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "node %s: %d GPUs, %d PCIe switches\n", n.Name, len(n.GPUs), len(n.SwitchUplinkBytesPerSec))
	for i, g := range n.GPUs {
		cc := "cc unknown"
		if g.ComputeCapability != 0 {
			cc = fmt.Sprintf("cc %d.%d", g.ComputeCapability/10, g.ComputeCapability%10)
		}
		fmt.Fprintf(&b, "  gpu %d: %s, %.1f GiB, %s, host link %s, PCIe switch %d\n", i, g.Name,
			float64(g.MemoryBytes)/(1<<30), cc, rate(g.H2DBytesPerSec), g.PCIeSwitch)
	}
	if bw, ok := n.allToAll(); ok {
		if bw == 0 {
			b.WriteString("  nvlink: none (GPU to GPU copies go through host memory)\n")
		} else {
			fmt.Fprintf(&b, "  nvlink: all-to-all, %s between every pair (one direction)\n", rate(bw))
		}
		return b.String()
	}
	for i := range n.GPUs {
		var peers []string
		for j := range n.GPUs {
			if bw := n.NVLink(i, j); bw > 0 {
				peers = append(peers, fmt.Sprintf("%d %s", j, rate(bw)))
			}
		}
		if len(peers) == 0 {
			peers = []string{"none"}
		}
		fmt.Fprintf(&b, "  nvlink from gpu %d: %s\n", i, strings.Join(peers, ", "))
	}
	return b.String()
}

// allToAll reports whether every ordered pair of distinct GPUs has the same NVLink bandwidth, and that bandwidth
// (0: no NVLink at all). A node of one GPU has no pair: (0, true).
func (n *Node) allToAll() (float64, bool) {
	var first float64
	seen := false
	for i := range n.GPUs {
		for j := range n.GPUs {
			if i == j {
				continue
			}
			bw := n.NVLink(i, j)
			if !seen {
				first, seen = bw, true
			} else if bw != first {
				return 0, false
			}
		}
	}
	return first, true
}

// rate renders bytes per second as GB/s.
func rate(bytesPerSec float64) string { return fmt.Sprintf("%.0f GB/s", bytesPerSec/1e9) }
