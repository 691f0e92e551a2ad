package cubin

import (
	"encoding/binary"
	"fmt"
	"sort"
)

// ELF constants used here (ELF64, little endian).
const (
	emCUDA        = 190
	shtSymtab     = 2
	shtRela       = 4
	shtNobits     = 8
	shtRel        = 9
	shtSymtabShnd = 18
	shtCUDAInfo   = 0x70000000
	shnUndef      = 0
	shnLoReserve  = 0xff00
	shnXIndex     = 0xffff
	sttObject     = 1
	sttFunc       = 2
	stoCUDAEntry  = 0x10 // st_other bit of a kernel (an __global__ function)
	stoCUDAManage = 0x04 // st_other bit of a __managed__ variable
	elfHeaderSize = 64
	shdrSize      = 64
	symSize       = 24
	relaSize      = 24
	relSize       = 16
	maxSections   = 1 << 20
)

// section is one section header, its name and its bytes (nil for NOBITS).
type section struct {
	name              string
	typ               uint32
	flags             uint64
	size, align       uint64
	link, info        uint32
	entsize           uint64
	data              []byte // the section's bytes in the image; nil for NOBITS
	index             int
	nameOff           uint32
	offset            uint64
	isNobits, hasData bool
}

type symbol struct {
	name  string
	info  byte
	other byte
	shndx uint32
	value uint64
	size  uint64
}

func (s symbol) typ() byte { return s.info & 0xf }

// elfFile is the parsed ELF structure of a cubin.
type elfFile struct {
	osabi, abiVersion byte
	flags             uint32
	sections          []section
	symbols           []symbol
	symtab            int // index of .symtab, -1 when absent
}

func u16(b []byte, off uint64) uint16 { return binary.LittleEndian.Uint16(b[off:]) }
func u32(b []byte, off uint64) uint32 { return binary.LittleEndian.Uint32(b[off:]) }
func u64(b []byte, off uint64) uint64 { return binary.LittleEndian.Uint64(b[off:]) }

// parseELF reads the headers, sections and symbols of an ELF64 little-endian image for EM_CUDA, checking every
// offset and size against the image.
func parseELF(img []byte) (*elfFile, error) {
	if len(img) < elfHeaderSize {
		return nil, fmt.Errorf("%w: %d bytes, shorter than an ELF header", ErrFormat, len(img))
	}
	if string(img[:4]) != "\x7fELF" {
		return nil, fmt.Errorf("%w: not an ELF image", ErrFormat)
	}
	if img[4] != 2 || img[5] != 1 {
		return nil, fmt.Errorf("%w: ELF class %d data %d, want 64-bit little endian", ErrFormat, img[4], img[5])
	}
	if m := u16(img, 18); m != emCUDA {
		return nil, fmt.Errorf("%w: ELF machine %d, want EM_CUDA (190)", ErrFormat, m)
	}
	f := &elfFile{osabi: img[7], abiVersion: img[8], flags: u32(img, 48), symtab: -1}
	shoff := u64(img, 40)
	shentsize := uint64(u16(img, 58))
	shnum := uint64(u16(img, 60))
	shstrndx := uint64(u16(img, 62))
	if shoff == 0 {
		return nil, fmt.Errorf("%w: no section headers", ErrFormat)
	}
	if shentsize != shdrSize {
		return nil, fmt.Errorf("%w: section header size %d, want %d", ErrFormat, shentsize, shdrSize)
	}
	if shoff > uint64(len(img)) || uint64(len(img))-shoff < shdrSize {
		return nil, fmt.Errorf("%w: section headers at %d outside the %d-byte image", ErrFormat, shoff, len(img))
	}
	if shnum == 0 || shstrndx == shnXIndex { // extended numbering: the counts live in section 0
		if shnum == 0 {
			shnum = u64(img, shoff+32)
		}
		if shstrndx == shnXIndex {
			shstrndx = uint64(u32(img, shoff+40))
		}
	}
	if shnum > maxSections || shnum > (uint64(len(img))-shoff)/shdrSize {
		return nil, fmt.Errorf("%w: %d section headers at %d do not fit the %d-byte image", ErrFormat, shnum, shoff,
			len(img))
	}
	f.sections = make([]section, shnum)
	for i := range f.sections {
		h := img[shoff+uint64(i)*shdrSize:]
		s := section{index: i, nameOff: u32(h, 0), typ: u32(h, 4), flags: u64(h, 8), offset: u64(h, 24),
			size: u64(h, 32), link: u32(h, 40), info: u32(h, 44), align: u64(h, 48), entsize: u64(h, 56)}
		s.isNobits = s.typ == shtNobits
		if !s.isNobits && s.typ != 0 {
			if s.offset > uint64(len(img)) || s.size > uint64(len(img))-s.offset {
				return nil, fmt.Errorf("%w: section %d: %d bytes at %d outside the %d-byte image", ErrFormat, i,
					s.size, s.offset, len(img))
			}
			s.data = img[s.offset : s.offset+s.size]
			s.hasData = true
		}
		f.sections[i] = s
	}
	if shstrndx >= shnum || !f.sections[shstrndx].hasData {
		return nil, fmt.Errorf("%w: section name table index %d", ErrFormat, shstrndx)
	}
	names := newStrtab(f.sections[shstrndx].data)
	for i := range f.sections {
		n, err := names.at(uint64(f.sections[i].nameOff))
		if err != nil {
			return nil, fmt.Errorf("%w: section %d name: %w", ErrFormat, i, err)
		}
		f.sections[i].name = n
	}
	for i, s := range f.sections {
		if s.typ == shtSymtab {
			f.symtab = i
			break
		}
	}
	if f.symtab >= 0 {
		if err := f.readSymbols(); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (f *elfFile) readSymbols() error {
	st := f.sections[f.symtab]
	if !st.hasData || st.size%symSize != 0 {
		return fmt.Errorf("%w: symbol table of %d bytes", ErrFormat, st.size)
	}
	if uint64(st.link) >= uint64(len(f.sections)) || !f.sections[st.link].hasData {
		return fmt.Errorf("%w: symbol table's string table index %d", ErrFormat, st.link)
	}
	strs := newStrtab(f.sections[st.link].data)
	var xindex []byte // SHT_SYMTAB_SHNDX: the section index of symbols whose st_shndx is SHN_XINDEX
	for _, s := range f.sections {
		if s.typ == shtSymtabShnd && int(s.link) == f.symtab && s.hasData {
			xindex = s.data
		}
	}
	n := st.size / symSize
	f.symbols = make([]symbol, n)
	for i := range n {
		b := st.data[i*symSize:]
		name, err := strs.at(uint64(u32(b, 0)))
		if err != nil {
			return fmt.Errorf("%w: symbol %d name: %w", ErrFormat, i, err)
		}
		s := symbol{name: name, info: b[4], other: b[5], shndx: uint32(u16(b, 6)), value: u64(b, 8),
			size: u64(b, 16)}
		if s.shndx == shnXIndex {
			if uint64(len(xindex)) < 4*(i+1) {
				return fmt.Errorf("%w: symbol %d has an extended section index and none is recorded", ErrFormat, i)
			}
			s.shndx = u32(xindex, 4*i)
		} else if s.shndx >= shnLoReserve {
			s.shndx = shnUndef // SHN_ABS, SHN_COMMON ...: not in a section of the image
		}
		if uint64(s.shndx) >= uint64(len(f.sections)) {
			return fmt.Errorf("%w: symbol %d (%s) in section %d of %d", ErrFormat, i, name, s.shndx,
				len(f.sections))
		}
		f.symbols[i] = s
	}
	return nil
}

// strtab is an ELF string table copied once into a string, with the positions of its NULs: names are substrings
// of it, so reading n names costs O(n log m) time and no memory however a hostile table makes them overlap.
type strtab struct {
	s    string
	nuls []uint32
}

func newStrtab(b []byte) strtab {
	t := strtab{s: string(b)}
	for i, c := range b {
		if c == 0 {
			t.nuls = append(t.nuls, uint32(i))
		}
	}
	return t
}

// at reads the NUL-terminated string at off.
func (t strtab) at(off uint64) (string, error) {
	if off >= uint64(len(t.s)) {
		if off == 0 {
			return "", nil
		}
		return "", fmt.Errorf("offset %d outside the %d-byte string table", off, len(t.s))
	}
	i := sort.Search(len(t.nuls), func(i int) bool { return uint64(t.nuls[i]) >= off })
	if i == len(t.nuls) {
		return "", fmt.Errorf("string at %d is not terminated", off)
	}
	return t.s[off:t.nuls[i]], nil
}
