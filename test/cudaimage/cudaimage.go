// Package cudaimage builds small synthetic CUDA module images - cubins and fat binaries laid out as nvcc and ptxas
// write them - for tests that run without NVIDIA's binaries (`make test` on any machine). What each field means is
// documented in packages gpuserver/device/cubin and gpuserver/device/fatbin; the tests that parse real binaries
// from the pinned CUDA 13 wheels check that the two agree.
package cudaimage

import (
	"encoding/binary"
	"fmt"

	"github.com/klauspost/compress/zstd"
)

// Section is a section of a synthetic cubin.
type Section struct {
	Name string
	Type uint32 // 1 PROGBITS, 8 NOBITS, 4 RELA, 0x70000000 SHT_CUDA_INFO ...
	Data []byte
	Size uint64 // for NOBITS
	// Align is sh_addralign.
	Align uint64
	// LinkSymtab sets sh_link to the symbol table; InfoSection sets sh_info to the named section's index.
	LinkSymtab  bool
	InfoSection string
}

// Symbol is a symbol of a synthetic cubin.
type Symbol struct {
	Name string
	// Info is st_info (bind << 4 | type: 0x12 global function, 0x01 local object, 0x03 section).
	Info byte
	// Other is st_other (0x10: a kernel, 0x04: __managed__).
	Other byte
	// Section names the section the symbol is in ("" for undefined).
	Section string
	Value   uint64
	Size    uint64
}

// Cubin is a synthetic cubin under construction.
type Cubin struct {
	flags    uint32
	sections []Section
	symbols  []Symbol
}

// NewCubin starts a cubin for sm_<arch> in the ELF ABI of CUDA 13 (EI_OSABI 0x41, the SM in e_flags bits 8..15).
func NewCubin(arch int) *Cubin { return &Cubin{flags: uint32(0x6000000 | arch<<8 | 4)} }

// Section adds a section.
func (c *Cubin) Section(s Section) *Cubin { c.sections = append(c.sections, s); return c }

// Symbol adds a symbol.
func (c *Cubin) Symbol(s Symbol) *Cubin { c.symbols = append(c.symbols, s); return c }

// Param is a kernel parameter's offset and size.
type Param struct{ Offset, Size uint32 }

// Kernel adds a kernel: its .text section, its entry symbol and its .nv.info.<name> section with one
// EIATTR_KPARAM_INFO per parameter in reverse ordinal order (as ptxas writes them), EIATTR_CBANK_PARAM_SIZE, and
// the extra records given.
func (c *Cubin) Kernel(name string, params []Param, extra ...[]byte) *Cubin {
	c.Section(Section{Name: ".text." + name, Type: 1, Data: make([]byte, 128), Align: 128})
	c.Symbol(Symbol{Name: name, Info: 0x12, Other: 0x10, Section: ".text." + name, Size: 128})
	var info []byte
	var end uint32
	for i := len(params) - 1; i >= 0; i-- {
		p := params[i]
		info = append(info, Record(0x17, le32(0), le16(uint16(i)), le16(uint16(p.Offset)),
			le32(0x1f000|p.Size<<18))...)
		end = max(end, p.Offset+p.Size)
	}
	if len(params) > 0 {
		info = append(info, 3, 0x19, byte(end), byte(end>>8))
	}
	for _, e := range extra {
		info = append(info, e...)
	}
	return c.Section(Section{Name: ".nv.info." + name, Type: 0x70000000, Data: info, LinkSymtab: true,
		InfoSection: ".text." + name, Align: 4})
}

// Record is a sized (format 4) .nv.info attribute record whose value is the concatenation of parts.
func Record(attr byte, parts ...[]byte) []byte {
	var d []byte
	for _, p := range parts {
		d = append(d, p...)
	}
	return append([]byte{4, attr, byte(len(d)), byte(len(d) >> 8)}, d...)
}

// SymbolIndex is the symbol table index the named symbol gets (0 when absent).
func (c *Cubin) SymbolIndex(name string) uint32 {
	for i, s := range c.symbols {
		if s.Name == name {
			return uint32(i + 1)
		}
	}
	return 0
}

// Rela is one SHT_RELA entry writing the address of symbol sym plus addend at off.
func (c *Cubin) Rela(off uint64, typ uint32, sym string, addend int64) []byte {
	return append(append(le64(off), le64(uint64(c.SymbolIndex(sym))<<32|uint64(typ))...), le64(uint64(addend))...)
}

func (c *Cubin) sectionIndex(name string) uint32 {
	for i, s := range c.sections {
		if s.Name == name {
			return uint32(i + 4) // after NULL, .shstrtab, .strtab, .symtab
		}
	}
	return 0
}

// Bytes lays the cubin out: ELF header, section contents (8-byte aligned), section headers.
func (c *Cubin) Bytes() []byte {
	shstr, str := []byte{0}, []byte{0}
	add := func(tab *[]byte, s string) uint32 {
		off := uint32(len(*tab))
		*tab = append(append(*tab, s...), 0)
		return off
	}
	type hdr struct {
		name, typ      uint32
		off, size      uint64
		link, info     uint32
		align, entsize uint64
		data           []byte
	}
	shstrName, strName, symName := add(&shstr, ".shstrtab"), add(&shstr, ".strtab"), add(&shstr, ".symtab")
	syms := make([]byte, 24)
	for _, s := range c.symbols {
		e := append(le32(add(&str, s.Name)), s.Info, s.Other)
		e = append(e, le16(uint16(c.sectionIndex(s.Section)))...)
		e = append(append(e, le64(s.Value)...), le64(s.Size)...)
		syms = append(syms, e...)
	}
	var names []uint32
	for _, s := range c.sections {
		names = append(names, add(&shstr, s.Name))
	}
	hdrs := []hdr{{}, {name: shstrName, typ: 3, data: shstr, align: 1}, {name: strName, typ: 3, data: str, align: 1},
		{name: symName, typ: 2, data: syms, link: 2, info: 1, align: 8, entsize: 24}}
	for i, s := range c.sections {
		h := hdr{name: names[i], typ: s.Type, data: s.Data, align: s.Align, size: s.Size}
		if s.LinkSymtab {
			h.link = 3
		}
		if s.InfoSection != "" {
			h.info = c.sectionIndex(s.InfoSection)
		}
		hdrs = append(hdrs, h)
	}
	out := make([]byte, 64)
	for i := range hdrs {
		for len(out)%8 != 0 {
			out = append(out, 0)
		}
		hdrs[i].off = uint64(len(out))
		if hdrs[i].typ == 8 || i == 0 {
			continue
		}
		hdrs[i].size = uint64(len(hdrs[i].data))
		out = append(out, hdrs[i].data...)
	}
	for len(out)%8 != 0 {
		out = append(out, 0)
	}
	shoff := uint64(len(out))
	for _, h := range hdrs {
		e := append(le32(h.name), le32(h.typ)...)
		e = append(append(append(e, le64(0)...), le64(0)...), le64(h.off)...)
		e = append(append(append(e, le64(h.size)...), le32(h.link)...), le32(h.info)...)
		out = append(append(append(out, e...), le64(h.align)...), le64(h.entsize)...)
	}
	copy(out, "\x7fELF")
	out[4], out[5], out[6], out[7], out[8] = 2, 1, 1, 0x41, 8
	binary.LittleEndian.PutUint16(out[16:], 2)   // ET_EXEC
	binary.LittleEndian.PutUint16(out[18:], 190) // EM_CUDA
	binary.LittleEndian.PutUint32(out[20:], 1)
	binary.LittleEndian.PutUint64(out[40:], shoff)
	binary.LittleEndian.PutUint32(out[48:], c.flags)
	binary.LittleEndian.PutUint16(out[52:], 64)
	binary.LittleEndian.PutUint16(out[58:], 64)
	binary.LittleEndian.PutUint16(out[60:], uint16(len(hdrs)))
	binary.LittleEndian.PutUint16(out[62:], 1)
	return out
}

// Entry kinds and flags of a fat binary (package fatbin documents them).
const (
	KindPTX        = 1
	KindELF        = 2
	FlagLZ4        = 0x2000
	FlagZstd       = 0x8000
	FlagArch       = 0x100000
	FlagFamily     = 0x200000
	fatbinMagic    = 0xBA55ED50
	flags64BitHost = 0x11
)

// Entry is one entry of a synthetic fat binary.
type Entry struct {
	Kind  uint16
	Arch  int
	Flags uint64
	// Data is the uncompressed content; FlagZstd compresses it here.
	Data []byte
	// Stored replaces the stored payload (an LZ4 block written by hand, say); Data still gives the declared size.
	Stored []byte
}

// Fatbin lays out a fat binary: 64-byte entry headers (112 from sm_100 on), payloads padded to 8 bytes, compressed
// and uncompressed sizes for compressed entries.
func Fatbin(entries ...Entry) ([]byte, error) {
	var body []byte
	for _, e := range entries {
		payload := e.Data
		var csize, usize uint64
		switch {
		case e.Stored != nil:
			payload = e.Stored
			csize, usize = uint64(len(payload)), uint64(len(e.Data))
		case e.Flags&FlagZstd != 0:
			enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
			if err != nil {
				return nil, fmt.Errorf("cudaimage: %w", err)
			}
			payload = enc.EncodeAll(e.Data, nil)
			if err := enc.Close(); err != nil {
				return nil, fmt.Errorf("cudaimage: %w", err)
			}
			csize, usize = uint64(len(payload)), uint64(len(e.Data))
		}
		padded := (len(payload) + 7) &^ 7
		ehs := 64
		if e.Arch >= 100 {
			ehs = 112
		}
		h := make([]byte, ehs)
		binary.LittleEndian.PutUint16(h[0:], e.Kind)
		binary.LittleEndian.PutUint16(h[2:], 0x0101)
		binary.LittleEndian.PutUint32(h[4:], uint32(ehs))
		binary.LittleEndian.PutUint64(h[8:], uint64(padded))
		binary.LittleEndian.PutUint32(h[16:], uint32(csize))
		binary.LittleEndian.PutUint16(h[24:], 8)
		binary.LittleEndian.PutUint16(h[26:], 1)
		binary.LittleEndian.PutUint32(h[28:], uint32(e.Arch))
		binary.LittleEndian.PutUint64(h[40:], flags64BitHost|e.Flags)
		binary.LittleEndian.PutUint64(h[56:], usize)
		body = append(append(append(body, h...), payload...), make([]byte, padded-len(payload))...)
	}
	out := make([]byte, 16, 16+len(body))
	binary.LittleEndian.PutUint32(out, fatbinMagic)
	binary.LittleEndian.PutUint16(out[4:], 1)
	binary.LittleEndian.PutUint16(out[6:], 16)
	binary.LittleEndian.PutUint64(out[8:], uint64(len(body)))
	return append(out, body...), nil
}

func le16(v uint16) []byte { return binary.LittleEndian.AppendUint16(nil, v) }
func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
func le64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

// LE32 and LE64 are little-endian encodings, for building records.
func LE32(v uint32) []byte { return le32(v) }
func LE64(v uint64) []byte { return le64(v) }
