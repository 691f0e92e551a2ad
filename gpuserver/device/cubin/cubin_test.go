package cubin_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cubin"
	"github.com/faas-gpu/faas-gpu/test/cudaimage"
)

type param = cudaimage.Param

// pr and dp are parameters (offset, size) of the builder and of the parser.
func pr(offset, size uint32) param        { return param{Offset: offset, Size: size} }
func dp(offset, size uint32) device.Param { return device.Param{Offset: offset, Size: size} }

// synthetic is a cubin with what ptxas writes for
//
//	__device__ int counter;                               // .nv.global
//	__device__ float table[2] = {1.5f, 2.5f};             // .nv.global.init
//	__device__ int *ptr = &counter;                       // .nv.global.init + R_CUDA_G64
//	__constant__ int cvals[2] = {7, 8};                   // .nv.constant3
//	extern "C" __global__ void vector_add(const float*, const float*, float*, unsigned);
//	__global__ void mixed(char, short, double, S3, V4);   // 16-aligned V4
//	extern "C" __global__ void noparams();                // with 2 KiB of static shared memory, 1024 threads max
func synthetic() *cudaimage.Cubin {
	c := cudaimage.NewCubin(90)
	c.Kernel("vector_add", []param{pr(0, 8), pr(8, 8), pr(16, 8), pr(24, 4)})
	c.Kernel("_Z5mixedcsd2S32V4", []param{pr(0, 1), pr(2, 2), pr(8, 8), pr(16, 3), pr(32, 16)})
	c.Kernel("noparams", nil, cudaimage.Record(0x05, cudaimage.LE32(256), cudaimage.LE32(4), cudaimage.LE32(1)))
	c.Section(cudaimage.Section{Name: ".nv.shared.noparams", Type: 8, Size: 2048, Align: 4,
		InfoSection: ".text.noparams"})
	init := append(append(cudaimage.LE64(0), le32f(1.5)...), le32f(2.5)...)
	c.Section(cudaimage.Section{Name: ".nv.global", Type: 8, Size: 4, Align: 4})
	c.Section(cudaimage.Section{Name: ".nv.global.init", Type: 1, Data: init, Align: 8})
	c.Section(cudaimage.Section{Name: ".nv.constant3", Type: 1, Data: append(cudaimage.LE32(7), cudaimage.LE32(8)...),
		Align: 4})
	c.Symbol(cudaimage.Symbol{Name: "counter", Info: 0x01, Section: ".nv.global", Size: 4})
	c.Symbol(cudaimage.Symbol{Name: "ptr", Info: 0x01, Section: ".nv.global.init", Size: 8})
	c.Symbol(cudaimage.Symbol{Name: "table", Info: 0x01, Section: ".nv.global.init", Value: 8, Size: 8})
	c.Symbol(cudaimage.Symbol{Name: "cvals", Info: 0x01, Section: ".nv.constant3", Size: 8})
	c.Symbol(cudaimage.Symbol{Name: "managed_v", Info: 0x01, Other: 0x04, Section: ".nv.global", Size: 0})
	// module-wide attributes: registers and frame size of vector_add
	va := c.SymbolIndex("vector_add")
	c.Section(cudaimage.Section{Name: ".nv.info", Type: 0x70000000, LinkSymtab: true, Align: 4,
		Data: append(cudaimage.Record(0x2f, cudaimage.LE32(va), cudaimage.LE32(12)),
			cudaimage.Record(0x11, cudaimage.LE32(va), cudaimage.LE32(16))...)})
	c.Section(cudaimage.Section{Name: ".rela.nv.global.init", Type: 4, Data: c.Rela(0, 4, "counter", 0),
		LinkSymtab: true, InfoSection: ".nv.global.init", Align: 8})
	return c
}

func le32f(f float32) []byte {
	b := make([]byte, 4)
	binary.LittleEndian.PutUint32(b, math.Float32bits(f))
	return b
}

func TestParseSynthetic(t *testing.T) {
	f, err := cubin.Parse(synthetic().Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if f.Arch != 90 {
		t.Errorf("arch %d", f.Arch)
	}
	want := []cubin.Kernel{
		{Name: "vector_add", Params: []device.Param{dp(0, 8), dp(8, 8), dp(16, 8), dp(24, 4)}, ParamBytes: 28,
			Registers: 12, LocalBytes: 16},
		{Name: "_Z5mixedcsd2S32V4", Params: []device.Param{dp(0, 1), dp(2, 2), dp(8, 8), dp(16, 3), dp(32, 16)},
			ParamBytes: 48},
		{Name: "noparams", SharedBytes: 2048, MaxThreads: 1024},
	}
	if !reflect.DeepEqual(f.Kernels, want) {
		t.Errorf("kernels:\n got %+v\nwant %+v", f.Kernels, want)
	}
	if len(f.Data) != 3 || f.Data[0].Name != ".nv.global" || f.Data[0].Init != nil || f.Data[0].Size != 4 ||
		f.Data[1].Name != ".nv.global.init" || f.Data[1].Size != 16 || f.Data[1].Align != 8 ||
		f.Data[2].Name != ".nv.constant3" || !bytes.Equal(f.Data[2].Init, []byte{7, 0, 0, 0, 8, 0, 0, 0}) {
		t.Fatalf("data: %+v", f.Data)
	}
	if r := f.Data[1].Relocs; len(r) != 1 || r[0] != (cubin.Reloc{Offset: 0, Size: 8, Data: 0, Target: 0,
		Symbol: "counter"}) {
		t.Errorf("relocations: %+v", r)
	}
	wantG := []cubin.Global{
		{Name: "counter", Data: 0, Size: 4},
		{Name: "ptr", Data: 1, Size: 8},
		{Name: "table", Data: 1, Offset: 8, Size: 8},
		{Name: "cvals", Data: 2, Size: 8, Constant: true},
		{Name: "managed_v", Data: 0, Managed: true},
	}
	if !reflect.DeepEqual(f.Globals, wantG) {
		t.Errorf("globals:\n got %+v\nwant %+v", f.Globals, wantG)
	}
	if g, ok := f.Global("table"); !ok || g.Offset != 8 {
		t.Errorf("Global(table) = %+v %v", g, ok)
	}
	if k, ok := f.Kernel("noparams"); !ok || k.SharedBytes != 2048 {
		t.Errorf("Kernel(noparams) = %+v %v", k, ok)
	}
}

func TestParseRefusesMalformedCubins(t *testing.T) {
	good := synthetic().Bytes()
	shoff := binary.LittleEndian.Uint64(good[40:])
	sh := func(i int) uint64 { return shoff + uint64(i)*64 }
	mutate := func(f func(b []byte)) []byte {
		b := append([]byte(nil), good...)
		f(b)
		return b
	}
	bad := map[string][]byte{
		"short":          good[:40],
		"not ELF":        mutate(func(b []byte) { b[1] = 'X' }),
		"32-bit":         mutate(func(b []byte) { b[4] = 1 }),
		"machine":        mutate(func(b []byte) { b[18] = 62 }),
		"shoff":          mutate(func(b []byte) { binary.LittleEndian.PutUint64(b[40:], 1<<40) }),
		"shentsize":      mutate(func(b []byte) { binary.LittleEndian.PutUint16(b[58:], 40) }),
		"shnum":          mutate(func(b []byte) { binary.LittleEndian.PutUint16(b[60:], 60000) }),
		"shstrndx":       mutate(func(b []byte) { binary.LittleEndian.PutUint16(b[62:], 500) }),
		"section bytes":  mutate(func(b []byte) { binary.LittleEndian.PutUint64(b[sh(4)+32:], 1<<50) }),
		"section name":   mutate(func(b []byte) { binary.LittleEndian.PutUint32(b[sh(5):], 1<<30) }),
		"symtab size":    mutate(func(b []byte) { binary.LittleEndian.PutUint64(b[sh(3)+32:], 25) }),
		"symtab strings": mutate(func(b []byte) { binary.LittleEndian.PutUint32(b[sh(3)+40:], 999) }),
	}
	// a parameter record overrunning its section, duplicate ordinals, a parameter past the buffer, a global
	// outside its section, a relocation outside its section
	c := cudaimage.NewCubin(90).Kernel("k", []param{pr(0, 8)})
	c.Section(cudaimage.Section{Name: ".nv.info.j", Type: 0x70000000, Data: []byte{4, 0x17, 200, 0}, LinkSymtab: true,
		InfoSection: ".text.k"})
	bad["record overrun"] = c.Bytes()
	bad["duplicate ordinal"] = cudaimage.NewCubin(90).Kernel("k", nil,
		cudaimage.Record(0x17, cudaimage.LE32(0), []byte{0, 0, 0, 0}, cudaimage.LE32(8<<18)),
		cudaimage.Record(0x17, cudaimage.LE32(0), []byte{0, 0, 8, 0}, cudaimage.LE32(8<<18))).Bytes()
	bad["param past buffer"] = cudaimage.NewCubin(90).Kernel("k", nil,
		cudaimage.Record(0x17, cudaimage.LE32(0), []byte{0, 0, 0, 0}, cudaimage.LE32(8<<18)), []byte{3, 0x19, 4, 0}).
		Bytes()
	bad["record format"] = cudaimage.NewCubin(90).Kernel("k", nil, []byte{9, 0x17, 0, 0}).Bytes()
	bad["global outside"] = cudaimage.NewCubin(90).
		Section(cudaimage.Section{Name: ".nv.global", Type: 8, Size: 4}).
		Symbol(cudaimage.Symbol{Name: "g", Info: 1, Section: ".nv.global", Value: 2, Size: 4}).Bytes()
	r := cudaimage.NewCubin(90).
		Section(cudaimage.Section{Name: ".nv.global.init", Type: 1, Data: make([]byte, 8)}).
		Symbol(cudaimage.Symbol{Name: "g", Info: 1, Section: ".nv.global.init", Size: 8})
	r.Section(cudaimage.Section{Name: ".rela.nv.global.init", Type: 4, Data: r.Rela(4, 2, "g", 0), LinkSymtab: true,
		InfoSection: ".nv.global.init"})
	bad["relocation outside"] = r.Bytes()
	for name, img := range bad {
		if _, err := cubin.Parse(img); !errors.Is(err, cubin.ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", name, err)
		}
	}
}

// FuzzParse: no input makes Parse panic; what it accepts is consistent (globals inside their sections,
// relocations inside theirs, parameters inside the argument buffer).
func FuzzParse(f *testing.F) {
	f.Add(synthetic().Bytes())
	f.Add(cudaimage.NewCubin(80).Kernel("k", []param{pr(0, 4)}).Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := cubin.Parse(b)
		if err != nil {
			return
		}
		for _, g := range c.Globals {
			if g.Data < 0 || g.Data >= len(c.Data) || g.Offset+g.Size > c.Data[g.Data].Size {
				t.Fatalf("global %+v outside %+v", g, c.Data)
			}
		}
		for _, d := range c.Data {
			if d.Init != nil && uint64(len(d.Init)) != d.Size {
				t.Fatalf("data %s: %d initial bytes for %d", d.Name, len(d.Init), d.Size)
			}
			for _, r := range d.Relocs {
				if r.Offset+uint64(r.Size) > d.Size || r.Data >= len(c.Data) {
					t.Fatalf("relocation %+v of %s", r, d.Name)
				}
			}
		}
		for _, k := range c.Kernels {
			if device.ArgsSize(k.Params) > k.ParamBytes {
				t.Fatalf("kernel %s: params %v past %d bytes", k.Name, k.Params, k.ParamBytes)
			}
		}
	})
}
