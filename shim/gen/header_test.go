package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/test/pyenv"
)

// TestHeaderEntries compares the API table's entries with the driver API of the pinned wheel's CUDA 13 headers,
// read at test time (never committed): every function cuda.h declares (with and without per-thread default
// streams, legacy names included) is a symbol of an entry, every entry's versions are those of the PFN_
// typedefs, and the built libcuda.so.1 exports every symbol. Part of make test-cuda.
func TestHeaderEntries(t *testing.T) {
	include := filepath.Join(pyenv.CUDA(pyenv.Require(t)), "include")
	h, err := ReadHeader(include)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("../api/cuda.api")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	api, err := Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	mine := map[string]string{}
	for _, e := range api.Entries {
		mine[e.Base] = e.String()
	}
	for _, e := range h.Entries {
		got, ok := mine[e.Base]
		switch {
		case !ok:
			t.Errorf("cudaTypedefs.h has %s; the API table has no entry (add: %s)", e.Base, e)
		case got != e.String():
			t.Errorf("%s: the API table has %q, the headers %q", e.Base, got, e)
		}
		delete(mine, e.Base)
	}
	for base, line := range mine {
		t.Errorf("the API table has %q, the headers have no %s", line, base)
	}
	symbols := map[string]bool{}
	for _, s := range api.Symbols() {
		symbols[s] = true
	}
	if len(h.Declared) < 600 {
		t.Fatalf("cuda.h declares only %d functions", len(h.Declared))
	}
	for _, d := range h.Declared {
		if !symbols[d] {
			t.Errorf("cuda.h declares %s; no entry of the API table has that symbol", d)
		}
	}

	lib := filepath.Join("..", "build", "libcuda.so.1")
	if out, err := exec.Command("make", "-s", "-C", "..").CombinedOutput(); err != nil {
		t.Fatalf("make -C shim: %v\n%s", err, out)
	}
	e, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	syms, err := e.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			exported[s.Name] = true
		}
	}
	missing := 0
	for s := range symbols {
		if !exported[s] {
			missing++
			t.Errorf("%s is not exported by %s", s, lib)
		}
	}
	t.Logf("%d entries, %d symbols, %d functions declared by cuda.h, all exported", len(h.Entries), len(symbols),
		len(h.Declared))
	if testing.Verbose() && missing == 0 {
		var n []string
		for s := range exported {
			if strings.HasPrefix(s, "cu") {
				n = append(n, s)
			}
		}
		t.Logf("%d cu* functions exported", len(n))
	}
}
