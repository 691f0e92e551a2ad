package fatbin_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/fatbin"
	"github.com/faas-gpu/faas-gpu/test/cudaimage"
)

type fixture = cudaimage.Entry

func build(t testing.TB, entries ...fixture) []byte {
	t.Helper()
	b, err := cudaimage.Fatbin(entries...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseAndDecompress(t *testing.T) {
	cubin80 := bytes.Repeat([]byte("\x7fELF sm_80 "), 50)
	cubin90 := bytes.Repeat([]byte("\x7fELF sm_90 cubin "), 300)
	ptx := []byte(".version 9.0\n.target sm_90\n.address_size 64\n\x00")
	// "abcabcabcabc-x": literals "abc", a 9-byte match at distance 3 (overlapping), then literals "-x".
	lz4 := []byte{0x35, 'a', 'b', 'c', 3, 0, 0x20, '-', 'x'}
	img := build(t,
		fixture{Kind: cudaimage.KindELF, Arch: 80, Data: cubin80},
		fixture{Kind: cudaimage.KindELF, Arch: 90, Flags: fatbin.FlagCompressedZstd, Data: cubin90},
		fixture{Kind: cudaimage.KindPTX, Arch: 90, Flags: fatbin.FlagCompressedLZ4, Data: []byte("abcabcabcabc-x"),
			Stored: lz4},
		fixture{Kind: cudaimage.KindPTX, Arch: 100, Flags: fatbin.FlagCompressedZstd | fatbin.FlagFamilySpecific,
			Data: ptx},
	)
	trailing := append(append([]byte(nil), img...), "next container"...)
	entries, size, err := fatbin.Parse(trailing)
	if err != nil {
		t.Fatal(err)
	}
	if size != uint64(len(img)) || len(entries) != 4 {
		t.Fatalf("size %d (want %d), %d entries", size, len(img), len(entries))
	}
	want := []struct {
		target, compression string
		data                []byte
	}{
		{"sm_80", "none", cubin80},
		{"sm_90", "zstd", cubin90},
		{"compute_90", "lz4", []byte("abcabcabcabc-x")},
		{"compute_100f", "zstd", ptx},
	}
	for i, e := range entries {
		if e.Target() != want[i].target || e.Compression() != want[i].compression || e.Index != i {
			t.Errorf("entry %d: %s", i, e)
		}
		got, err := e.Data(1 << 20)
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		// a stored entry keeps its padding (the driver reads PTX as a C string, a cubin by its headers)
		if !bytes.Equal(bytes.TrimRight(got, "\x00"), bytes.TrimRight(want[i].data, "\x00")) {
			t.Errorf("entry %d: %q", i, got[:min(len(got), 40)])
		}
	}
	if _, err := entries[1].Data(100); !errors.Is(err, fatbin.ErrTooLarge) {
		t.Fatalf("limit below the entry's size: %v", err)
	}
}

func TestSelectLikeTheDriver(t *testing.T) {
	e := func(kind fatbin.Kind, arch int, flags uint64) fixture {
		return fixture{Kind: uint16(kind), Arch: arch, Flags: flags, Data: []byte{byte(arch)}}
	}
	const a, f = fatbin.FlagArchSpecific, fatbin.FlagFamilySpecific
	img := build(t,
		e(fatbin.KindELF, 75, 0), e(fatbin.KindELF, 80, 0), e(fatbin.KindELF, 86, 0),
		e(fatbin.KindELF, 90, 0), e(fatbin.KindELF, 90, a), e(fatbin.KindELF, 100, f), e(fatbin.KindELF, 103, a),
		e(fatbin.KindPTX, 80, 0), e(fatbin.KindPTX, 120, 0))
	entries, _, err := fatbin.Parse(img)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cc   int
		want string
	}{
		{75, "sm_75"}, {80, "sm_80"}, {86, "sm_86"}, {87, "sm_86"}, {89, "sm_86"},
		{90, "sm_90a"},       // the arch-specific cubin is the most specific for exactly 9.0
		{100, "sm_100f"},     // family-specific: 10.x
		{103, "sm_103a"},     // exact arch-specific beats the family's
		{101, "sm_100f"},     // sm_103a runs only on 10.3
		{110, "compute_80"},  // no 11.x cubin: the PTX of the highest virtual arch not above 11.0
		{121, "compute_120"}, // 12.1: compute_120 PTX
		{70, "no binary (7.0)"},
	} {
		got, err := fatbin.Select(entries, c.cc)
		if c.cc == 70 {
			if !errors.Is(err, fatbin.ErrNoBinaryForGPU) || !strings.Contains(err.Error(), "sm_75") {
				t.Errorf("cc 7.0: %v, want ErrNoBinaryForGPU listing the targets", err)
			}
			continue
		}
		if err != nil || got.Target() != c.want {
			t.Errorf("cc %d: %s (%v), want %s", c.cc, got.Target(), err, c.want)
		}
	}
}

func TestParseRefusesMalformedImages(t *testing.T) {
	good := build(t, fixture{Kind: cudaimage.KindELF, Arch: 90, Flags: fatbin.FlagCompressedZstd,
		Data: bytes.Repeat([]byte("x"), 1000)})
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for name, img := range map[string][]byte{
		"short":              good[:10],
		"magic":              mutate(func(b []byte) []byte { b[0] ^= 1; return b }),
		"header size":        mutate(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[6:], 8); return b }),
		"body past the end":  mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], 1<<62); return b }),
		"entry header size":  mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[20:], 8); return b }),
		"payload past end":   mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[24:], 1<<40); return b }),
		"compressed > block": mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[32:], 1<<30); return b }),
		"truncated entry":    mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], 40); return b[:56] }),
	} {
		if _, _, err := fatbin.Parse(img); !errors.Is(err, fatbin.ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", name, err)
		}
	}
	// a declared uncompressed size that does not match the frame
	bad := mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[16+56:], 999); return b })
	entries, _, err := fatbin.Parse(bad)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := entries[0].Data(1 << 20); !errors.Is(err, fatbin.ErrFormat) {
		t.Errorf("wrong uncompressed size: %v", err)
	}
	if !fatbin.IsWrapper([]byte{0xb1, 0x43, 0x62, 0x46, 1, 0, 0, 0}) || fatbin.IsFatbin(good[:3]) {
		t.Error("magic detection")
	}
}

func TestLZ4Refusals(t *testing.T) {
	for name, block := range map[string][]byte{
		"literals past the end": {0x50, 'a'},
		"offset 0":              {0x10, 'a', 0, 0, 0x00},
		"offset before start":   {0x10, 'a', 2, 0, 0x00},
		"truncated offset":      {0x10, 'a', 1},
		"truncated length":      {0xf0, 255},
		"output too large":      {0x1f, 'a', 1, 0, 255, 255, 255, 10},
	} {
		img := build(t, fixture{Kind: cudaimage.KindPTX, Arch: 90, Flags: fatbin.FlagCompressedLZ4,
			Data: make([]byte, 64), Stored: block})
		entries, _, err := fatbin.Parse(img)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := entries[0].Data(1 << 20); !errors.Is(err, fatbin.ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", name, err)
		}
	}
}

// FuzzParse: no input makes Parse or Data panic or allocate past the limit.
func FuzzParse(f *testing.F) {
	f.Add(build(f, fixture{Kind: cudaimage.KindELF, Arch: 90, Flags: fatbin.FlagCompressedZstd,
		Data: bytes.Repeat([]byte("cubin"), 40)}))
	f.Add(build(f, fixture{Kind: cudaimage.KindPTX, Arch: 90, Flags: fatbin.FlagCompressedLZ4, Data: make([]byte, 14),
		Stored: []byte{0x35, 'a', 'b', 'c', 3, 0, 0x20, '-', 'x'}}))
	f.Add(build(f, fixture{Kind: cudaimage.KindELF, Arch: 100, Data: []byte("plain")},
		fixture{Kind: cudaimage.KindPTX, Arch: 80, Data: []byte(".version")}))
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, size, err := fatbin.Parse(b)
		if err != nil {
			return
		}
		if size > uint64(len(b)) {
			t.Fatalf("container of %d bytes in a %d-byte image", size, len(b))
		}
		for _, e := range entries {
			if d, err := e.Data(1 << 16); err == nil && uint64(len(d)) > 1<<16 {
				t.Fatalf("%d bytes past the limit", len(d))
			}
		}
		_, _ = fatbin.Select(entries, 90)
	})
}
