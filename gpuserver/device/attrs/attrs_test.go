package attrs

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestH100MatchesTheRealGPU compares the H100 model with the table a real H100 80GB HBM3 reported (driver
// 580.159.04, CUDA 13.0: shim/testdata/trace/device-h100.tsv). Only the PCI location differs (a slot of the
// simulated node): bus, device, domain and the board group.
func TestH100MatchesTheRealGPU(t *testing.T) {
	f, err := os.Open("../../../shim/testdata/trace/device-h100.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := ForModel("NVIDIA H100 80GB HBM3")
	if err != nil {
		t.Fatal(err)
	}
	table := m.Table()
	table.SetPCI(m, 0, 0, 6)
	location := map[Attr]bool{PciBusId: true, PciDeviceId: true, PciDomainId: true, MultiGpuBoardGroupId: true}
	seen := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), "\t")
		if fs[0] != "attr" {
			continue
		}
		a, err := strconv.Atoi(fs[1])
		if err != nil {
			t.Fatalf("bad line %q", sc.Text())
		}
		if a >= Count {
			if fs[2] != "error" {
				t.Errorf("the driver knows attribute %d (%s) beyond CU_DEVICE_ATTRIBUTE_MAX %d", a, fs[2], Count)
			}
			continue
		}
		v, err := strconv.Atoi(fs[2])
		if err != nil {
			t.Errorf("attribute %d: the driver answered %q", a, strings.Join(fs[2:], " "))
			continue
		}
		seen++
		if location[Attr(a)] {
			continue
		}
		if got := table.Get(Attr(a)); got != int32(v) {
			t.Errorf("attribute %d: model %d, real H100 %d", a, got, v)
		}
	}
	if seen != Count-1 {
		t.Errorf("compared %d attributes, want %d", seen, Count-1)
	}
}

func TestModels(t *testing.T) {
	for _, m := range Models {
		got, err := ForModel(m.Name + " (simulated)")
		if err != nil || got.Name != m.Name {
			t.Errorf("%s: %v %v", m.Name, got.Name, err)
		}
		tb := m.Table()
		if tb.Get(MultiprocessorCount) == 0 || tb.Get(ComputeCapabilityMajor) == 0 || tb.Get(WarpSize) != 32 {
			t.Errorf("%s: incomplete table", m.Name)
		}
		if ForArch(m.ComputeCapability()).Name != m.Name && m.Name != "NVIDIA H200" {
			t.Errorf("ForArch(%d) is %s", m.ComputeCapability(), ForArch(m.ComputeCapability()).Name)
		}
	}
	if _, err := ForModel("Radeon"); err == nil {
		t.Error("an unknown model has a table")
	}
	if v, h := ForArch(70).ComputeCapability(), ForArch(90).ComputeCapability(); v != 70 || h != 90 {
		t.Errorf("V100 %d, H100 %d", v, h)
	}
}
