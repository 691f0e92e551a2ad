package topology

import (
	"fmt"
	"time"
)

// Path is the route of one transfer: From is Host or a GPU index, To is a GPU index.
type Path struct {
	From int `json:"from"`
	To   int `json:"to"`
}

// HostPath is the path from host memory to GPU gpu.
func HostPath(gpu int) Path { return Path{From: Host, To: gpu} }

// PeerPath is the path from GPU from to GPU to.
func PeerPath(from, to int) Path { return Path{From: from, To: to} }

// IsHost reports whether the transfer starts in host memory.
func (p Path) IsHost() bool { return p.From == Host }

// String is "host->2" or "0->3".
func (p Path) String() string {
	if p.IsHost() {
		return fmt.Sprintf("host->%d", p.To)
	}
	return fmt.Sprintf("%d->%d", p.From, p.To)
}

// Kind says which link a path uses: "pcie" from host (or between GPUs without NVLink), "nvlink" otherwise.
func (n *Node) Kind(p Path) string {
	if p.IsHost() || n.NVLink(p.From, p.To) == 0 {
		return "pcie"
	}
	return "nvlink"
}

// Rate is the bandwidth in bytes per second that the transfer on p gets while the transfers in active run at the
// same time (active may or may not contain p itself; p is always counted once). The model:
//
//   - from host: the GPU's own link, or its switch uplink divided among the host transfers behind that switch,
//     whichever is lower (with Slowdown.HostSameSwitch set: the lower of the two, its time multiplied by that
//     factor once per concurrent host transfer behind the same switch); each concurrent host transfer behind
//     another switch multiplies the time by Slowdown.HostOtherSwitch;
//   - GPU to GPU over NVLink: the pair's bandwidth divided among the transfers on that directed pair; each
//     concurrent NVLink transfer on another pair that touches one of its GPUs multiplies the time by
//     Slowdown.NVLinkOtherPair;
//   - GPU to GPU without NVLink: staged through host memory, so the slower of the two GPUs' host links, sharing
//     the destination's switch uplink like a host transfer;
//   - in every case a GPU runs at most CopyEngines inbound transfers at full speed; more share them.
func (n *Node) Rate(p Path, active []Path) float64 {
	dst := n.GPUs[p.To]
	inbound, sameSwitchHost, otherSwitchHost, samePair, otherPairTouching := 1, 1, 0, 1, 0
	selfSeen := false
	for _, a := range active {
		if a == p && !selfSeen {
			selfSeen = true
			continue
		}
		if a.To == p.To {
			inbound++
		}
		aHost := a.IsHost() || n.NVLink(a.From, a.To) == 0
		if aHost {
			if n.GPUs[a.To].PCIeSwitch == dst.PCIeSwitch {
				sameSwitchHost++
			} else {
				otherSwitchHost++
			}
			continue
		}
		if a.From == p.From && a.To == p.To {
			samePair++
		} else if a.From == p.From || a.To == p.To || a.From == p.To || a.To == p.From {
			otherPairTouching++
		}
	}
	var rate float64
	if nv := n.NVLink(p.From, p.To); !p.IsHost() && nv > 0 {
		rate = nv / float64(samePair)
		for range otherPairTouching {
			rate /= n.Slowdown.NVLinkOtherPair
		}
	} else {
		link := dst.H2DBytesPerSec
		if !p.IsHost() {
			link = min(link, n.GPUs[p.From].H2DBytesPerSec)
		}
		if hs := n.Slowdown.HostSameSwitch; hs > 0 {
			rate = min(link, n.SwitchUplinkBytesPerSec[dst.PCIeSwitch])
			for range sameSwitchHost - 1 {
				rate /= hs
			}
		} else {
			rate = min(link, n.SwitchUplinkBytesPerSec[dst.PCIeSwitch]/float64(sameSwitchHost))
		}
		for range otherSwitchHost {
			rate /= n.Slowdown.HostOtherSwitch
		}
	}
	if ce := dst.CopyEngines; inbound > ce {
		rate *= float64(ce) / float64(inbound)
	}
	return rate
}

// TransferTime is how long moving bytes over p takes while the transfers in active run concurrently for its whole
// length (the rate taken as constant), including the node's fixed per-transfer latency. Transfers advances
// transfers whose set of concurrent transfers changes as they run.
func (n *Node) TransferTime(bytes uint64, p Path, active []Path) time.Duration {
	sec := n.TransferLatencySec + float64(bytes)/n.Rate(p, active)
	return time.Duration(sec * float64(time.Second))
}

// SlowdownOf is the factor by which concurrent transfers stretch a transfer on p: TransferTime with active divided
// by TransferTime alone (without the fixed latency). It is 1 when nothing interferes.
func (n *Node) SlowdownOf(p Path, active []Path) float64 {
	return n.Rate(p, nil) / n.Rate(p, active)
}

// FastestPeer returns, among the candidate source GPUs, the one with the highest NVLink bandwidth to GPU to, and
// that bandwidth; it returns -1 and 0 when none has NVLink to it.
func (n *Node) FastestPeer(to int, candidates []int) (int, float64) {
	best, bw := -1, 0.0
	for _, c := range candidates {
		if c == to {
			continue
		}
		if b := n.NVLink(c, to); b > bw {
			best, bw = c, b
		}
	}
	return best, bw
}
