// Package nvml discovers a node's topology (package topology) with NVML through go-nvml, which loads
// libnvidia-ml at run time: GPU names and memory, PCIe bus ids, which GPUs share a PCIe switch, PCIe link
// bandwidth, and NVLink peers with their link counts. After a failed Init nothing else is called (any other NVML
// call would kill the process).
package nvml

import (
	"errors"
	"fmt"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// Per-link NVLink bandwidth (one direction, effective) by NVLink version, bytes per second.
func nvlinkBytesPerSec(version uint32) float64 {
	switch version {
	case 1:
		return 20e9
	case 2, 3, 4, 5:
		return 25e9
	}
	return 25e9
}

// PCIe bandwidth per lane (one direction, effective at about 80% of the raw rate) by generation.
func pcieLaneBytesPerSec(gen int) float64 {
	switch gen {
	case 1:
		return 0.2e9
	case 2:
		return 0.4e9
	case 3:
		return 0.79e9
	case 4:
		return 1.58e9
	case 5:
		return 3.15e9
	}
	return 6.3e9 // 6 and later
}

// Discover describes the node through lib (nvml.New() in production, a mock in tests). It initialises and shuts
// down lib itself.
func Discover(lib gonvml.Interface, name string) (topology.Node, error) {
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		return topology.Node{}, fmt.Errorf("nvml: %w: init: %v", device.ErrUnavailable, gonvml.ErrorString(ret))
	}
	defer lib.Shutdown()
	count, ret := lib.DeviceGetCount()
	if ret != gonvml.SUCCESS || count == 0 {
		return topology.Node{}, fmt.Errorf("nvml: %w: no GPU (%v)", device.ErrUnavailable, ret)
	}
	type dev struct {
		h   gonvml.Device
		bus string
	}
	devs := make([]dev, count)
	node := topology.Node{Name: name, NVLinkBytesPerSec: make([][]float64, count)}
	for i := range count {
		h, ret := lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			return topology.Node{}, fmt.Errorf("nvml: gpu %d: %v", i, ret)
		}
		gname, ret := h.GetName()
		if ret != gonvml.SUCCESS {
			return topology.Node{}, fmt.Errorf("nvml: gpu %d: name: %v", i, ret)
		}
		mem, ret := h.GetMemoryInfo()
		if ret != gonvml.SUCCESS {
			return topology.Node{}, fmt.Errorf("nvml: gpu %d: memory: %v", i, ret)
		}
		pci, ret := h.GetPciInfo()
		if ret != gonvml.SUCCESS {
			return topology.Node{}, fmt.Errorf("nvml: gpu %d: pci: %v", i, ret)
		}
		gen, r1 := h.GetMaxPcieLinkGeneration()
		width, r2 := h.GetMaxPcieLinkWidth()
		h2d := 12e9
		if r1 == gonvml.SUCCESS && r2 == gonvml.SUCCESS && width > 0 {
			h2d = pcieLaneBytesPerSec(gen) * float64(width)
		}
		devs[i] = dev{h: h, bus: busID(pci)}
		node.GPUs = append(node.GPUs, topology.GPU{Name: gname, MemoryBytes: mem.Total, CopyEngines: 2,
			H2DBytesPerSec: h2d, PCIeSwitch: -1})
		node.NVLinkBytesPerSec[i] = make([]float64, count)
	}
	// GPUs whose closest common ancestor is a PCIe switch share its uplink
	for i := range count {
		if node.GPUs[i].PCIeSwitch >= 0 {
			continue
		}
		sw := len(node.SwitchUplinkBytesPerSec)
		node.GPUs[i].PCIeSwitch = sw
		node.SwitchUplinkBytesPerSec = append(node.SwitchUplinkBytesPerSec, node.GPUs[i].H2DBytesPerSec)
		for j := i + 1; j < count; j++ {
			lvl, ret := lib.DeviceGetTopologyCommonAncestor(devs[i].h, devs[j].h)
			if ret == gonvml.SUCCESS && lvl <= gonvml.TOPOLOGY_MULTIPLE && node.GPUs[j].PCIeSwitch < 0 {
				node.GPUs[j].PCIeSwitch = sw
			}
		}
	}
	byBus := map[string]int{}
	for i, d := range devs {
		byBus[d.bus] = i
	}
	for i, d := range devs {
		for link := range gonvml.NVLINK_MAX_LINKS {
			state, ret := d.h.GetNvLinkState(link)
			if errors.Is(ret, gonvml.ERROR_NOT_SUPPORTED) || ret == gonvml.ERROR_INVALID_ARGUMENT {
				break
			}
			if ret != gonvml.SUCCESS || state != gonvml.FEATURE_ENABLED {
				continue
			}
			remote, ret := d.h.GetNvLinkRemotePciInfo(link)
			if ret != gonvml.SUCCESS {
				continue
			}
			j, ok := byBus[busID(remote)]
			if !ok || j == i {
				continue // an NVSwitch, or not one of ours
			}
			version, ret := d.h.GetNvLinkVersion(link)
			if ret != gonvml.SUCCESS {
				version = 0
			}
			node.NVLinkBytesPerSec[i][j] += nvlinkBytesPerSec(version)
		}
	}
	node.Slowdown = topology.Slowdown{HostOtherSwitch: 1.03, NVLinkOtherPair: 1}
	node.TransferLatencySec = 10e-6
	return node, node.Validate()
}

func busID(p gonvml.PciInfo) string {
	var b strings.Builder
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return strings.ToLower(b.String())
}
