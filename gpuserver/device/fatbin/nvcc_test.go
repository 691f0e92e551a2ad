package fatbin_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/fatbin"
	"github.com/faas-gpu/faas-gpu/test/pyenv"
)

// targets are the -gencode options of the fat binaries the tests build: cubins for 8.0, 9.0, 9.0a and the 10.x
// family, and compute_90 PTX.
var targets = []string{
	"-gencode", "arch=compute_80,code=sm_80",
	"-gencode", "arch=compute_90,code=sm_90",
	"-gencode", "arch=compute_90a,code=sm_90a",
	"-gencode", "arch=compute_100f,code=sm_100f",
	"-gencode", "arch=compute_90,code=compute_90",
}

func nvccFatbin(t *testing.T, mode string) []byte {
	t.Helper()
	dir := pyenv.Require(t)
	out := filepath.Join(t.TempDir(), "fat.fatbin")
	args := append([]string{"-fatbin", "-compress-mode=" + mode, "-o", out}, targets...)
	cmd := exec.Command(pyenv.NVCC(dir), append(args, "testdata/fat.cu")...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nvcc: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNVCCCompressionModes: fat binaries nvcc writes with every compression mode hold the same targets, and their
// entries decompress (LZ4 for "speed", Zstandard for the others) to exactly the bytes of the uncompressed one;
// Select chooses among them as the driver does.
func TestNVCCCompressionModes(t *testing.T) {
	plain := nvccFatbin(t, "none")
	ref, size, err := fatbin.Parse(plain)
	if err != nil {
		t.Fatal(err)
	}
	if size != uint64(len(plain)) {
		t.Errorf("container of %d bytes in a %d-byte file", size, len(plain))
	}
	var got []string
	for _, e := range ref {
		got = append(got, e.Target())
	}
	want := []string{"sm_80", "compute_90", "sm_90", "sm_90a", "sm_100f"}
	if !sameSet(got, want) {
		t.Fatalf("targets %v, want %v", got, want)
	}
	for _, mode := range []string{"default", "speed", "size", "balance"} {
		entries, _, err := fatbin.Parse(nvccFatbin(t, mode))
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		compressed := map[string]int{}
		for i, e := range entries {
			if i >= len(ref) || e.Target() != ref[i].Target() {
				t.Fatalf("%s: entry %d is %s", mode, i, e)
			}
			compressed[e.Compression()]++
			d, err := e.Data(64 << 20)
			if err != nil {
				t.Fatalf("%s: %v", mode, err)
			}
			r, _ := ref[i].Data(64 << 20)
			if !bytes.Equal(bytes.TrimRight(d, "\x00"), bytes.TrimRight(r, "\x00")) {
				t.Errorf("%s: %s decompresses to %d bytes that differ from the %d stored ones", mode, e, len(d),
					len(r))
			}
		}
		wantKind := "zstd"
		if mode == "speed" {
			wantKind = "lz4"
		}
		if compressed[wantKind] == 0 {
			t.Errorf("%s: compressions %v, want some %s", mode, compressed, wantKind)
		}
		if mode == "default" {
			checkSelect(t, entries)
		}
	}
}

// checkSelect: the driver's choice among the targets of a real fat binary.
func checkSelect(t *testing.T, entries []fatbin.Entry) {
	t.Helper()
	for cc, want := range map[int]string{80: "sm_80", 86: "sm_80", 89: "sm_80", 90: "sm_90a", 100: "sm_100f",
		103: "sm_100f", 120: "compute_90", 121: "compute_90"} {
		e, err := fatbin.Select(entries, cc)
		if err != nil || e.Target() != want {
			t.Errorf("cc %d: %s %v, want %s", cc, e.Target(), err, want)
		}
	}
	if _, err := fatbin.Select(entries, 75); err == nil {
		t.Error("cc 7.5 got an entry; the fat binary has none for it")
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, x := range a {
		m[x]++
	}
	for _, x := range b {
		m[x]--
	}
	for _, v := range m {
		if v != 0 {
			return false
		}
	}
	return true
}
