package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Entry is one driver API function as cuGetProcAddress knows it: a base name ("cuCtxCreate") and the CUDA
// versions at which its ABI changed. The i-th version (from 0, ascending) is the symbol base, base_v2, base_v3,
// ...; a per-thread default stream variant (ptds or ptsz) at version v is the symbol current at v with that
// suffix. This is how cuda.h and cudaTypedefs.h name them (the header test checks the rule against both).
type Entry struct {
	Base     string
	Variants []Variant // ascending by version; per-thread variants after the plain one of the same version
	Line     int
}

// Variant is one symbol of an entry.
type Variant struct {
	Version int
	PT      string // "", "_ptds" or "_ptsz"
	Symbol  string
}

// parseEntry parses the fields after "entry": a base name, then versions (ascending) and ptds:/ptsz: versions.
func parseEntry(f []string, line int) (Entry, error) {
	if len(f) < 2 || !identRE.MatchString(f[0]) {
		return Entry{}, fmt.Errorf("entry needs a name and at least one version")
	}
	e := Entry{Base: f[0], Line: line}
	var plain []int
	type pt struct {
		v      int
		suffix string
	}
	var pts []pt
	for _, s := range f[1:] {
		suffix := ""
		if p, v, ok := strings.Cut(s, ":"); ok {
			if p != "ptds" && p != "ptsz" {
				return Entry{}, fmt.Errorf("%s: bad variant %q (want ptds:<version> or ptsz:<version>)", f[0], s)
			}
			suffix, s = "_"+p, v
		}
		v, err := strconv.Atoi(s)
		if err != nil || v < 1000 || v > 99990 {
			return Entry{}, fmt.Errorf("%s: bad version %q", f[0], s)
		}
		if suffix != "" {
			pts = append(pts, pt{v, suffix})
			continue
		}
		if len(plain) > 0 && v <= plain[len(plain)-1] {
			return Entry{}, fmt.Errorf("%s: versions must ascend (%d after %d)", f[0], v, plain[len(plain)-1])
		}
		plain = append(plain, v)
	}
	if len(plain) == 0 {
		return Entry{}, fmt.Errorf("%s: no plain version", f[0])
	}
	symbol := func(i int) string {
		if i == 0 {
			return e.Base
		}
		return fmt.Sprintf("%s_v%d", e.Base, i+1)
	}
	for i, v := range plain {
		e.Variants = append(e.Variants, Variant{Version: v, Symbol: symbol(i)})
	}
	for _, p := range pts {
		i := sort.SearchInts(plain, p.v+1) - 1
		if i < 0 {
			return Entry{}, fmt.Errorf("%s: per-thread variant at %d precedes the first version %d", f[0], p.v, plain[0])
		}
		e.Variants = append(e.Variants, Variant{Version: p.v, PT: p.suffix, Symbol: symbol(i) + p.suffix})
	}
	sort.SliceStable(e.Variants, func(i, j int) bool {
		a, b := e.Variants[i], e.Variants[j]
		if a.Version != b.Version {
			return a.Version < b.Version
		}
		return a.PT < b.PT
	})
	return e, nil
}

// String renders the entry as its line of the API table.
func (e Entry) String() string {
	f := []string{"entry", e.Base}
	for _, v := range e.Variants {
		if v.PT == "" {
			f = append(f, strconv.Itoa(v.Version))
		}
	}
	for _, v := range e.Variants {
		if v.PT != "" {
			f = append(f, v.PT[1:]+":"+strconv.Itoa(v.Version))
		}
	}
	return strings.Join(f, " ")
}

// Symbols lists every exported symbol of the entries, sorted.
func (api *API) Symbols() []string {
	var s []string
	for _, e := range api.Entries {
		for _, v := range e.Variants {
			s = append(s, v.Symbol)
		}
	}
	sort.Strings(s)
	return s
}
