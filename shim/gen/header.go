package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

var (
	declRE = regexp.MustCompile(`\bCUresult\s+(cu\w+)\s*\(`)
	pfnRE  = regexp.MustCompile(`PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\)`)
)

// Header is the driver API as NVIDIA's headers declare it.
type Header struct {
	// Declared is every function cuda.h declares, with and without the per-thread default stream and legacy
	// names (cuda.h preprocessed twice, once as the driver itself sees it with __CUDA_API_VERSION_INTERNAL).
	Declared []string
	// Entries are derived from the PFN_<name>_v<version>[_ptds|_ptsz] typedefs of cudaTypedefs.h and of the
	// profiler and graphics interoperability (GL, EGL, VDPAU) typedef headers.
	Entries []Entry
}

// ReadHeader reads the driver API from a CUDA include directory (cuda.h, cudaTypedefs.h,
// cudaProfilerTypedefs.h). It preprocesses cuda.h with cc (gcc by default).
func ReadHeader(include string) (*Header, error) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	declared := map[string]bool{}
	for _, defs := range [][]string{nil, {"-D__CUDA_API_VERSION_INTERNAL"}} {
		args := append([]string{"-E", "-P", "-I", include}, defs...)
		out, err := exec.Command(cc, append(args, filepath.Join(include, "cuda.h"))...).Output()
		if err != nil {
			return nil, fmt.Errorf("preprocess cuda.h: %w", err)
		}
		for _, m := range declRE.FindAllStringSubmatch(string(out), -1) {
			declared[m[1]] = true
		}
	}
	h := &Header{}
	for n := range declared {
		h.Declared = append(h.Declared, n)
	}
	sort.Strings(h.Declared)

	type ver struct {
		v  int
		pt string
	}
	vers := map[string][]ver{}
	for _, f := range []string{"cudaTypedefs.h", "cudaProfilerTypedefs.h", "cudaGLTypedefs.h", "cudaEGLTypedefs.h", "cudaVDPAUTypedefs.h"} {
		b, err := os.ReadFile(filepath.Join(include, f))
		if err != nil {
			return nil, err
		}
		for _, m := range pfnRE.FindAllStringSubmatch(string(b), -1) {
			v, _ := strconv.Atoi(m[2])
			vers[m[1]] = append(vers[m[1]], ver{v, m[3]})
		}
	}
	var bases []string
	for b := range vers {
		bases = append(bases, b)
	}
	sort.Strings(bases)
	for _, b := range bases {
		seen := map[ver]bool{}
		var plain []int
		var pts []string
		for _, v := range vers[b] {
			if seen[v] {
				continue
			}
			seen[v] = true
			if v.pt == "" {
				plain = append(plain, v.v)
			} else {
				pts = append(pts, fmt.Sprintf("%s:%d", v.pt[1:], v.v))
			}
		}
		sort.Ints(plain)
		sort.Strings(pts)
		f := []string{b}
		for _, v := range plain {
			f = append(f, strconv.Itoa(v))
		}
		e, err := parseEntry(append(f, pts...), 0)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b, err)
		}
		h.Entries = append(h.Entries, e)
	}
	return h, nil
}

// EntryLines renders the entries as lines of the API table.
func (h *Header) EntryLines() string {
	var b strings.Builder
	for _, e := range h.Entries {
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	return b.String()
}
