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

// nvlinkEfficiency is the share of an NVLink's peak bandwidth a copy achieves, as in the a100x8 and h100x8 presets
// (240 GB/s of 12 x 25 GB/s, 360 GB/s of 18 x 25 GB/s): the node model holds effective figures, not link peaks.
const nvlinkEfficiency = 0.8

// nvlinkLinkBytesPerSec is one NVLink's peak bandwidth in one direction by NVLink generation: 20 GB/s for NVLink 1
// (P100), 25 GB/s for NVLink 2, 3 and 4 (V100: 6 links, A100: 12, H100: 18 = 450 GB/s a direction, the 900 GB/s
// "bidirectional" of NVIDIA's data sheet), 50 GB/s for NVLink 5 (B200: 18 links, 1.8 TB/s bidirectional) and
// later (a floor: no faster generation is assumed).
func nvlinkLinkBytesPerSec(gen int) float64 {
	switch {
	case gen == 1:
		return 20e9
	case gen >= 5:
		return 50e9
	}
	return 25e9
}

// nvlinkGeneration is the NVLink generation of a GPU. Its architecture decides where it is known (compute
// capability major 6: NVLink 1, 7: 2, 8: 3, 9: 4, 10: 5), because what nvmlDeviceGetNvLinkVersion answers has
// changed meaning: drivers now answer the nvmlNvlinkVersion_t enumeration that go-nvml binds (NVLINK_VERSION_3_0
// is 4, _4_0 is 6, _5_0 is 7), older ones the generation itself, so "4" alone may be an A100 or an H100. Without
// the architecture the answer is read as the enumeration; 0 means unknown.
func nvlinkGeneration(ccMajor int, version uint32) int {
	switch ccMajor {
	case 6, 7, 8, 9, 10:
		return ccMajor - 5
	}
	switch gonvml.NvlinkVersion(version) {
	case gonvml.NVLINK_VERSION_1_0:
		return 1
	case gonvml.NVLINK_VERSION_2_0, gonvml.NVLINK_VERSION_2_2:
		return 2
	case gonvml.NVLINK_VERSION_3_0, gonvml.NVLINK_VERSION_3_1:
		return 3
	case gonvml.NVLINK_VERSION_4_0:
		return 4
	case gonvml.NVLINK_VERSION_5_0:
		return 5
	case gonvml.NVLINK_VERSION_6_0:
		return 6
	}
	return 0
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
	devs := make([]nvlinkDevice, count)
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
		major, minor, ret := h.GetCudaComputeCapability()
		cc := 0
		if ret != gonvml.SUCCESS || major < 3 {
			major = 0
		} else {
			cc = 10*major + minor
		}
		devs[i] = nvlinkDevice{h: h, bus: busID(pci), ccMajor: major}
		node.GPUs = append(node.GPUs, topology.GPU{Name: gname, MemoryBytes: mem.Total, CopyEngines: 2,
			H2DBytesPerSec: h2d, PCIeSwitch: -1, ComputeCapability: cc})
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
	links := discoverNVLinks(devs)
	for i := range count {
		for j := range count {
			node.NVLinkBytesPerSec[i][j] = links.bytesPerSec(i, j)
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

// nvlinkDevice is one GPU as the NVLink discovery needs it.
type nvlinkDevice struct {
	h       gonvml.Device
	bus     string // PCI bus id, lower case
	ccMajor int    // compute capability major, 0: unknown
}

// nvlinks is what the links of a node's GPUs lead to: for each GPU, its active links to each peer GPU and to each
// NVSwitch (by the switch's PCI bus id), and the bandwidth of one of its links.
type nvlinks struct {
	direct   []map[int]int    // direct[i][j]: links from GPU i straight to GPU j
	toSwitch []map[string]int // toSwitch[i][bus]: links from GPU i to the NVSwitch at bus
	perLink  []float64        // one link's effective bandwidth, one direction, of GPU i
}

// discoverNVLinks walks every GPU's NVLinks. A link whose far end is another GPU of the node is a direct link; one
// whose far end is an NVSwitch (NVML says so, NVLINK_DEVICE_TYPE_SWITCH) joins the GPU to every other GPU with a
// link to the same switch. Where the driver cannot tell the far end's type, a far end that is not one of the
// node's GPUs is taken for a switch: it joins GPUs only if two or more of them reach it. Other far ends (an IBM NPU,
// the GPU itself, an unknown device) carry no GPU-to-GPU traffic and are skipped.
func discoverNVLinks(devs []nvlinkDevice) nvlinks {
	count := len(devs)
	l := nvlinks{direct: make([]map[int]int, count), toSwitch: make([]map[string]int, count),
		perLink: make([]float64, count)}
	byBus := map[string]int{}
	for i := range count {
		byBus[devs[i].bus] = i
		l.direct[i], l.toSwitch[i] = map[int]int{}, map[string]int{}
	}
	for i := range count {
		d := devs[i]
		gen := 0
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
			bus := busID(remote)
			j, ours := byBus[bus]
			kind, kret := d.h.GetNvLinkRemoteDeviceType(link)
			switch {
			case kret == gonvml.SUCCESS && kind == gonvml.NVLINK_DEVICE_TYPE_SWITCH:
				l.toSwitch[i][bus]++
			case ours && j != i && (kret != gonvml.SUCCESS || kind == gonvml.NVLINK_DEVICE_TYPE_GPU):
				l.direct[i][j]++
			case kret != gonvml.SUCCESS && !ours:
				l.toSwitch[i][bus]++
			default:
				continue
			}
			if gen == 0 {
				version, ret := d.h.GetNvLinkVersion(link)
				if ret != gonvml.SUCCESS {
					version = 0
				}
				gen = nvlinkGeneration(d.ccMajor, version)
			}
		}
		l.perLink[i] = nvlinkLinkBytesPerSec(gen) * nvlinkEfficiency
	}
	return l
}

// bytesPerSec is the NVLink bandwidth from GPU i to GPU j: its direct links, plus, through every NVSwitch both
// reach, as many links as the one with fewer links to that switch has (an HGX H100 board: 18 links per GPU over
// four NVSwitches, 5+4+4+5, so 18 links between any two GPUs, all to all), at the slower GPU's link bandwidth.
func (l nvlinks) bytesPerSec(i, j int) float64 {
	if i == j {
		return 0
	}
	n := l.direct[i][j]
	for bus, li := range l.toSwitch[i] {
		n += min(li, l.toSwitch[j][bus])
	}
	return float64(n) * min(l.perLink[i], l.perLink[j])
}
