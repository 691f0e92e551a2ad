package nvml_test

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/nvml"
)

// smiTopo reads `nvidia-smi topo -m`: the connection between each pair of GPUs by their index (X, NV<links>, PIX,
// PXB, PHB, NODE, SYS), the NIC rows and columns and the affinity columns left out.
func smiTopo(out string) (map[[2]int]string, error) {
	var cols []int // GPU index of each column of the header, -1 for any other column
	topo := map[[2]int]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "\t")
		if cols == nil {
			if len(f) > 1 && strings.TrimSpace(f[0]) == "" && strings.TrimSpace(f[1]) == "GPU0" {
				for _, c := range f[1:] {
					i, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(c), "GPU"))
					if err != nil || !strings.HasPrefix(strings.TrimSpace(c), "GPU") {
						i = -1
					}
					cols = append(cols, i)
				}
			}
			continue
		}
		row := strings.TrimSpace(f[0])
		if !strings.HasPrefix(row, "GPU") {
			continue
		}
		i, err := strconv.Atoi(strings.TrimPrefix(row, "GPU"))
		if err != nil {
			return nil, fmt.Errorf("row %q: %w", row, err)
		}
		for k, c := range f[1:] {
			if k < len(cols) && cols[k] >= 0 {
				topo[[2]int{i, cols[k]}] = strings.TrimSpace(c)
			}
		}
	}
	if cols == nil {
		return nil, fmt.Errorf("no header line with GPU0 in:\n%s", out)
	}
	return topo, nil
}

// TestSmiTopoReadsTheMatrix: an HGX-like matrix of NV18 pairs with NIC columns, and a PCIe pair.
func TestSmiTopoReadsTheMatrix(t *testing.T) {
	out := "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" +
		"GPU0\t X \tNV18\tSYS\tPIX\t0-55\t0\t\tN/A\n" +
		"GPU1\tNV18\t X \tSYS\tSYS\t0-55\t0\t\tN/A\n" +
		"GPU2\tSYS\tSYS\t X \tSYS\t56-111\t1\t\tN/A\n" +
		"NIC0\tPIX\tSYS\tSYS\t X \n\nLegend:\n\n  X    = Self\n"
	topo, err := smiTopo(out)
	if err != nil {
		t.Fatal(err)
	}
	for pair, want := range map[[2]int]string{{0, 1}: "NV18", {1, 0}: "NV18", {0, 0}: "X", {0, 2}: "SYS",
		{2, 1}: "SYS"} {
		if got := topo[pair]; got != want {
			t.Errorf("GPU%d-GPU%d: %q, want %q", pair[0], pair[1], got, want)
		}
	}
	if len(topo) != 9 {
		t.Errorf("%d entries, want 9 (3 GPUs by 3): %v", len(topo), topo)
	}
	if _, err := smiTopo("no matrix here"); err == nil {
		t.Error("an output without the matrix was read")
	}
}

// TestCUDADiscoversNVSwitchTopology (GPU suite, step 7): the node NVML discovery gives the gpuserver has an NVLink
// between exactly the pairs `nvidia-smi topo -m` shows connected by NV<links>, and a node whose every pair has the
// same number of links (an NVSwitch board) is described as all-to-all. It prints both, with the driver.
func TestCUDADiscoversNVSwitchTopology(t *testing.T) {
	if os.Getenv("FAAS_GPU_TEST_CUDA") != "1" {
		t.Skip("needs an NVIDIA GPU: set FAAS_GPU_TEST_CUDA=1 (make gpu-test)")
	}
	lib := gonvml.New()
	node, err := nvml.Discover(lib, "local")
	if err != nil {
		t.Fatal(err)
	}
	driver := "unknown"
	if lib.Init() == gonvml.SUCCESS {
		if v, ret := lib.SystemGetDriverVersion(); ret == gonvml.SUCCESS {
			driver = v
		}
		_ = lib.Shutdown()
	}
	t.Logf("driver %s; discovered:\n%s", driver, node.Describe())
	out, err := exec.Command("nvidia-smi", "topo", "-m").Output()
	if err != nil {
		t.Fatalf("nvidia-smi topo -m: %v", err)
	}
	t.Logf("nvidia-smi topo -m:\n%s", out)
	topo, err := smiTopo(string(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(node.GPUs) < 2 {
		t.Skipf("%d GPU: no pair whose link to compare (the discovery and the matrix are printed above)",
			len(node.GPUs))
	}
	links := map[string]bool{}
	for i := range node.GPUs {
		for j := range node.GPUs {
			if i == j {
				continue
			}
			c, ok := topo[[2]int{i, j}]
			if !ok {
				t.Fatalf("nvidia-smi topo -m has no entry for GPU%d-GPU%d", i, j)
			}
			nv := strings.HasPrefix(c, "NV")
			if got := node.NVLink(i, j); nv != (got > 0) {
				t.Errorf("GPU%d-GPU%d: nvidia-smi says %s, the discovery %.0f GB/s of NVLink", i, j, c, got/1e9)
			}
			links[c] = true
		}
	}
	if len(links) == 1 && strings.HasPrefix(strings.Join(keys(links), ""), "NV") &&
		!strings.Contains(node.Describe(), "all-to-all") {
		t.Errorf("every pair is %v (an NVSwitch board), but the discovery is not all-to-all:\n%s", keys(links),
			node.Describe())
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
