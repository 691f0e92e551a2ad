package nvml_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/nvml"
)

func pci(bus string) gonvml.PciInfo {
	var p gonvml.PciInfo
	for i, c := range bus {
		p.BusId[i] = int8(c)
	}
	return p
}

// TestDiscoverMockDGX: go-nvml's fake DGX A100, with two NVLinks from each GPU to the next one and GPUs paired
// behind PCIe switches.
func TestDiscoverMockDGX(t *testing.T) {
	srv := dgxa100.New()
	n := len(srv.Devices)
	bus := func(i int) string { return fmt.Sprintf("00000000:%02X:00.0", 0x10+i) }
	devs := map[gonvml.Device]int{}
	for i, d := range srv.Devices {
		md := d.(*dgxa100.Device)
		devs[md] = i
		md.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) { return pci(bus(i)), gonvml.SUCCESS }
		md.GetMaxPcieLinkGenerationFunc = func() (int, gonvml.Return) { return 4, gonvml.SUCCESS }
		md.GetMaxPcieLinkWidthFunc = func() (int, gonvml.Return) { return 16, gonvml.SUCCESS }
		md.GetNvLinkStateFunc = func(link int) (gonvml.EnableState, gonvml.Return) {
			if link >= 12 {
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			}
			if link < 2 {
				return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
			}
			return gonvml.FEATURE_DISABLED, gonvml.SUCCESS
		}
		md.GetNvLinkRemotePciInfoFunc = func(int) (gonvml.PciInfo, gonvml.Return) {
			return pci(bus((i + 1) % n)), gonvml.SUCCESS
		}
		md.GetNvLinkVersionFunc = func(int) (uint32, gonvml.Return) { return 3, gonvml.SUCCESS }
		md.GetNvLinkRemoteDeviceTypeFunc = func(int) (gonvml.IntNvLinkDeviceType, gonvml.Return) {
			return gonvml.NVLINK_DEVICE_TYPE_GPU, gonvml.SUCCESS
		}
	}
	srv.DeviceGetTopologyCommonAncestorFunc = func(a, b gonvml.Device) (gonvml.GpuTopologyLevel, gonvml.Return) {
		if devs[a]/2 == devs[b]/2 {
			return gonvml.TOPOLOGY_MULTIPLE, gonvml.SUCCESS
		}
		return gonvml.TOPOLOGY_SYSTEM, gonvml.SUCCESS
	}
	node, err := nvml.Discover(srv, "dgx")
	if err != nil {
		t.Fatal(err)
	}
	if len(node.GPUs) != n || node.GPUs[0].Name == "" || node.GPUs[0].MemoryBytes == 0 {
		t.Fatalf("gpus: %+v", node.GPUs)
	}
	if !node.SameSwitch(0, 1) || node.SameSwitch(1, 2) || len(node.SwitchUplinkBytesPerSec) != n/2 {
		t.Fatalf("switches: %+v %v", node.GPUs, node.SwitchUplinkBytesPerSec)
	}
	if got := node.NVLink(0, 1); got != 40e9 {
		t.Fatalf("nvlink 0->1 = %v, want two NVLink 3 links of 25 GB/s at 80%%", got)
	}
	if node.NVLink(0, 2) != 0 {
		t.Fatal("no link 0->2")
	}
}

// hgxH100 is go-nvml's fake DGX turned into an HGX H100 board as NVML describes one: eight H100s (compute
// capability 9.0), each with 18 NVLinks, none to another GPU: links 0-4 go to NVSwitch 0, 5-8 to switch 1, 9-12 to
// switch 2 and 13-17 to switch 3 (the board's 5+4+4+5), and NVML names each far end an NVSwitch by its own PCI bus id.
// version is what GetNvLinkVersion answers, ccOK whether the compute capability is known, typeOK whether the driver
// tells the far end's type (else ERROR_NOT_SUPPORTED); enabled says which links are up.
func hgxH100(version uint32, ccOK, typeOK bool, enabled func(gpu, link int) bool) *dgxa100.Server {
	srv := dgxa100.New()
	bus := func(i int) string { return fmt.Sprintf("00000000:%02X:00.0", 0x18+0x10*i) }
	switchBus := func(s int) string { return fmt.Sprintf("00000000:%02X:00.0", 0xA0+s) }
	switchOf := func(link int) int {
		switch {
		case link < 5:
			return 0
		case link < 9:
			return 1
		case link < 13:
			return 2
		}
		return 3
	}
	devs := map[gonvml.Device]int{}
	for i, d := range srv.Devices {
		md := d.(*dgxa100.Device)
		devs[md] = i
		md.GetNameFunc = func() (string, gonvml.Return) { return "NVIDIA H100 80GB HBM3", gonvml.SUCCESS }
		md.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) {
			return gonvml.Memory{Total: 81559 << 20}, gonvml.SUCCESS
		}
		md.GetCudaComputeCapabilityFunc = func() (int, int, gonvml.Return) {
			if !ccOK {
				return 0, 0, gonvml.ERROR_NOT_SUPPORTED
			}
			return 9, 0, gonvml.SUCCESS
		}
		md.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) { return pci(bus(i)), gonvml.SUCCESS }
		md.GetMaxPcieLinkGenerationFunc = func() (int, gonvml.Return) { return 5, gonvml.SUCCESS }
		md.GetMaxPcieLinkWidthFunc = func() (int, gonvml.Return) { return 16, gonvml.SUCCESS }
		md.GetNvLinkStateFunc = func(link int) (gonvml.EnableState, gonvml.Return) {
			if link >= 18 {
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			}
			if !enabled(i, link) {
				return gonvml.FEATURE_DISABLED, gonvml.SUCCESS
			}
			return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
		}
		md.GetNvLinkRemotePciInfoFunc = func(link int) (gonvml.PciInfo, gonvml.Return) {
			return pci(switchBus(switchOf(link))), gonvml.SUCCESS
		}
		md.GetNvLinkRemoteDeviceTypeFunc = func(int) (gonvml.IntNvLinkDeviceType, gonvml.Return) {
			if !typeOK {
				return 0, gonvml.ERROR_NOT_SUPPORTED
			}
			return gonvml.NVLINK_DEVICE_TYPE_SWITCH, gonvml.SUCCESS
		}
		md.GetNvLinkVersionFunc = func(int) (uint32, gonvml.Return) { return version, gonvml.SUCCESS }
	}
	srv.DeviceGetTopologyCommonAncestorFunc = func(a, b gonvml.Device) (gonvml.GpuTopologyLevel, gonvml.Return) {
		if devs[a]/2 == devs[b]/2 {
			return gonvml.TOPOLOGY_MULTIPLE, gonvml.SUCCESS
		}
		return gonvml.TOPOLOGY_SYSTEM, gonvml.SUCCESS
	}
	return srv
}

// TestDiscoverHGXH100ThroughNVSwitches: GPUs whose every NVLink ends at an NVSwitch are all-to-all over NVLink 4,
// 18 links x 25 GB/s a direction (450 GB/s, NVIDIA's "900 GB/s bidirectional") at 80%: 360 GB/s, the h100x8
// preset's figure. The generation comes from the architecture, whichever convention the driver's NVLink version
// follows (the generation 4 itself, or nvmlNvlinkVersion_t's NVLINK_VERSION_4_0 = 6); without the architecture
// the version is read as the enumeration; without the far end's type, a far end that is no GPU of the node and
// that several GPUs reach is a switch.
func TestDiscoverHGXH100ThroughNVSwitches(t *testing.T) {
	all := func(int, int) bool { return true }
	for _, c := range []struct {
		name          string
		version       uint32
		ccOK, typeOK  bool
		wantPerGPUSec float64
	}{
		{"version is the generation", 4, true, true, 360e9},
		{"version is nvmlNvlinkVersion_t", uint32(gonvml.NVLINK_VERSION_4_0), true, true, 360e9},
		{"architecture unknown", uint32(gonvml.NVLINK_VERSION_4_0), false, true, 360e9},
		{"architecture unknown, NVLink 5", uint32(gonvml.NVLINK_VERSION_5_0), false, true, 720e9},
		{"far end's type unknown", 4, true, false, 360e9},
	} {
		t.Run(c.name, func(t *testing.T) {
			node, err := nvml.Discover(hgxH100(c.version, c.ccOK, c.typeOK, all), "hgx")
			if err != nil {
				t.Fatal(err)
			}
			for i := range node.GPUs {
				for j := range node.GPUs {
					want := c.wantPerGPUSec
					if i == j {
						want = 0
					}
					if got := node.NVLink(i, j); got != want {
						t.Fatalf("nvlink %d->%d = %v, want %v", i, j, got, want)
					}
				}
			}
			if d := node.Describe(); !strings.Contains(d, fmt.Sprintf("all-to-all, %.0f GB/s", c.wantPerGPUSec/1e9)) {
				t.Fatalf("describe:\n%s", d)
			}
			if c.ccOK && node.GPUs[0].ComputeCapability != 90 {
				t.Fatalf("compute capability %d, want 90", node.GPUs[0].ComputeCapability)
			}
		})
	}
	// A board whose GPU 7 lost its links to switch 3 (links 13-17): its pairs keep the 13 links through switches
	// 0-2; every other pair keeps 18.
	node, err := nvml.Discover(hgxH100(4, true, true, func(gpu, link int) bool { return gpu != 7 || link < 13 }), "hgx")
	if err != nil {
		t.Fatal(err)
	}
	if got := node.NVLink(7, 0); got != 13*20e9 {
		t.Fatalf("nvlink 7->0 = %v, want 13 links of 20 GB/s", got)
	}
	if got := node.NVLink(0, 7); got != 13*20e9 {
		t.Fatalf("nvlink 0->7 = %v, want 13 links of 20 GB/s", got)
	}
	if got := node.NVLink(0, 1); got != 360e9 {
		t.Fatalf("nvlink 0->1 = %v, want 360 GB/s", got)
	}
	if d := node.Describe(); !strings.Contains(d, "nvlink from gpu 7: 0 260 GB/s") {
		t.Fatalf("describe:\n%s", d)
	}
}

type failingInit struct {
	gonvml.Interface
	calls int
}

func (f *failingInit) Init() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }

// TestDiscoverCallsNothingAfterFailedInit: the embedded nil interface would panic on any other call.
func TestDiscoverCallsNothingAfterFailedInit(t *testing.T) {
	_, err := nvml.Discover(&failingInit{}, "x")
	if !errors.Is(err, device.ErrUnavailable) {
		t.Fatalf("err %v, want ErrUnavailable", err)
	}
}

func TestDiscoverCUDA(t *testing.T) {
	if os.Getenv("FAAS_GPU_TEST_CUDA") != "1" {
		t.Skip("needs an NVIDIA GPU: set FAAS_GPU_TEST_CUDA=1 (make gpu-test)")
	}
	node, err := nvml.Discover(gonvml.New(), "local")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("discovered:\n%s", node.Describe())
}
