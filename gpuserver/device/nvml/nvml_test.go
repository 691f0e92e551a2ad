package nvml_test

import (
	"errors"
	"fmt"
	"os"
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
	if got := node.NVLink(0, 1); got != 50e9 {
		t.Fatalf("nvlink 0->1 = %v, want two links of 25 GB/s", got)
	}
	if node.NVLink(0, 2) != 0 {
		t.Fatal("no link 0->2")
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
	t.Logf("node: %+v", node)
}
