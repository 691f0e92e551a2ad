// Package cubin reads what a simulated device needs from a CUDA cubin (the ELF image ptxas writes, alone or inside
// a fat binary: see package fatbin): its kernels with their parameter layouts and static resources, and its module
// globals (__device__, __constant__ and __managed__ variables) with their sizes, initial bytes and the addresses
// those bytes hold. It is pure Go and reads untrusted bytes: every offset and size is checked against the image
// and no input makes it panic.
//
// # Where the facts come from
//
//   - Kernels are the FUNC symbols marked as entries (st_other bit 0x10, STO_CUDA_ENTRY). Each has a section of
//     type SHT_CUDA_INFO (0x70000000) named .nv.info.<kernel> whose sh_info is the kernel's .text section; it is a
//     list of attribute records: u8 format (1 none, 2 byte, 3 u16: a 4-byte record; 4 sized: u16 size then the
//     bytes), u8 attribute (EIATTR_*).
//   - Parameters come from EIATTR_KPARAM_INFO (0x17) records, one per parameter: u32 index, u16 ordinal, u16 offset
//     in the argument buffer, u32 whose bits 18..31 are the size in bytes. They are ordered by ordinal; the kernel's
//     argument buffer size is EIATTR_CBANK_PARAM_SIZE (0x19, a u16), which equals the end of the last parameter.
//     This is the layout cuFuncGetParamInfo reports and the driver copies from CU_LAUNCH_PARAM_BUFFER_POINTER.
//   - Static resources (cuFuncGetAttribute): registers from EIATTR_REGCOUNT (0x2f) and local memory from
//     EIATTR_FRAME_SIZE (0x11) in the module-wide .nv.info section, keyed by the kernel's symbol index; static
//     shared memory is the size of the .nv.shared.<kernel> section linked to the kernel's text, less the 1 KiB
//     window ptxas reserves at its start from sm_90 on (when the cubin has .nv.shared.reserved.N); the block size
//     limit comes from EIATTR_MAX_THREADS (0x05) or EIATTR_REQNTID (0x10) when the kernel declares one.
//   - Module globals are the OBJECT symbols of the data sections .nv.global (zero-initialised, NOBITS),
//     .nv.global.init (initialised) and .nv.constant<N> for N >= 1 (__constant__ data: bank 3 holds the program's,
//     others the compiler's; bank 0 is the per-kernel parameter bank, never a global). A symbol's value is its
//     offset in its section. cuModuleGetGlobal finds a global by name, and a loader places each data section once
//     and a global at the section's address plus the symbol's value.
//   - Initial bytes that are addresses (`__device__ int *p = &x;`) are relocations against the data sections
//     (.rela.nv.global.init, .rel.nv.constant4 ...): R_CUDA_32/R_CUDA_G32 (1, 3) write the low 4 bytes and
//     R_CUDA_64/R_CUDA_G64 (2, 4) 8 bytes of S + A, where S is the target symbol's address. Other relocation types
//     patch code and do not concern a simulated device.
//   - Program headers are not read. ptxas writes them after the section headers, so an image cut after its
//     section headers parses the same (a loader that sizes a cubin by e_shoff + e_shnum * e_shentsize drops them;
//     the real driver needs the whole file: e_phoff + e_phnum * e_phentsize is its end).
//   - The architecture is e_flags bits 8..15 in the ELF ABI of CUDA 12.8 and later (EI_OSABI 0x41: 0x6005a04 is
//     sm_90) and bits 0..7 before.
package cubin

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// ErrFormat is wrapped by every error about an image that is not a well-formed cubin.
var ErrFormat = errors.New("malformed cubin")

// EIATTR attributes read here.
const (
	attrMaxThreads     = 0x05
	attrReqNTID        = 0x10
	attrFrameSize      = 0x11
	attrKParamInfo     = 0x17
	attrCBankParamSize = 0x19
	attrRegCount       = 0x2f
	attrKParamInfoV2   = 0x45
)

// Relocation types that write addresses into data.
const (
	relCUDA32  = 1
	relCUDA64  = 2
	relCUDAG32 = 3
	relCUDAG64 = 4
)

// reservedSharedWindow is the shared memory ptxas reserves at the start of every kernel's .nv.shared.<kernel>
// section from sm_90 on (cubins that have a .nv.shared.reserved.N section); it is not the kernel's static shared
// memory (ptxas -v and cuFuncGetAttribute do not count it).
const reservedSharedWindow = 1024

// maxParams bounds a kernel's parameter count (a 32 KiB argument buffer of 1-byte parameters).
const maxParams = 32768

// File is what a simulated device loads from a cubin.
type File struct {
	// Arch is the architecture the cubin was compiled for, major*10+minor (90 for sm_90); 0 when unknown.
	Arch int
	// Kernels in symbol table order.
	Kernels []Kernel
	// Data are the sections that hold module globals, in section order.
	Data []Data
	// Globals in symbol table order.
	Globals []Global
}

// Kernel is an entry function.
type Kernel struct {
	Name string
	// Params in ordinal (declaration) order.
	Params []device.Param
	// ParamBytes is the size of the argument buffer (EIATTR_CBANK_PARAM_SIZE; 0 without parameters).
	ParamBytes uint32
	// Registers per thread (EIATTR_REGCOUNT).
	Registers int
	// SharedBytes of static shared memory.
	SharedBytes uint64
	// LocalBytes of local memory per thread (EIATTR_FRAME_SIZE).
	LocalBytes uint64
	// MaxThreads per block the kernel was compiled for (__launch_bounds__ / .maxntid / .reqntid); 0 when it
	// declares none.
	MaxThreads int
}

// Data is one section holding module globals.
type Data struct {
	// Name of the section: .nv.global, .nv.global.init, .nv.constant3 ...
	Name string
	// Size in bytes and Align(ment), at least 1.
	Size, Align uint64
	// Init is the section's initial bytes (len Size, aliasing the image); nil when they are all zero.
	Init []byte
	// Relocs are the addresses to write into the section once every data section is placed.
	Relocs []Reloc
}

// Reloc writes an address into a data section: Size (4 or 8) bytes at Offset receive the address of byte Target
// of data section Data (when Data >= 0); for Data < 0 the target (a function, say) has no address a simulated
// device could give, and the initial bytes stay.
type Reloc struct {
	Offset uint64
	Size   int
	Data   int
	Target uint64
	// Symbol is the target symbol's name.
	Symbol string
}

// Global is a module global.
type Global struct {
	Name string
	// Data is the index in File.Data of the global's section, Offset its place there.
	Data   int
	Offset uint64
	Size   uint64
	// Constant: a __constant__ variable; Managed: a __managed__ one.
	Constant, Managed bool
}

// IsCubin reports whether image starts like an ELF file (a cubin, when its machine is EM_CUDA).
func IsCubin(image []byte) bool { return len(image) >= 4 && string(image[:4]) == "\x7fELF" }

// Parse reads a cubin.
func Parse(image []byte) (*File, error) {
	f, err := parseELF(image)
	if err != nil {
		return nil, err
	}
	out := &File{Arch: f.arch()}
	if f.symtab < 0 {
		return out, nil // no symbols: no kernels and no globals
	}
	info, err := f.moduleInfo()
	if err != nil {
		return nil, err
	}
	if err := f.kernels(out, info); err != nil {
		return nil, err
	}
	if err := f.data(out); err != nil {
		return nil, err
	}
	return out, nil
}

func (f *elfFile) arch() int {
	if f.osabi == 0x41 || f.abiVersion >= 8 {
		return int(f.flags >> 8 & 0xff)
	}
	return int(f.flags & 0xff)
}

// record is one .nv.info attribute.
type record struct {
	format, attr byte
	value        uint16 // formats 2 and 3
	data         []byte // format 4
}

// records splits a .nv.info section into its attribute records.
func records(sec section) ([]record, error) {
	var out []record
	b := sec.data
	for off := 0; off < len(b); {
		if len(b)-off < 4 {
			return nil, fmt.Errorf("%w: %s: truncated record at %d", ErrFormat, sec.name, off)
		}
		r := record{format: b[off], attr: b[off+1], value: u16(b, uint64(off+2))}
		off += 4
		switch r.format {
		case 1, 2, 3:
		case 4:
			n := int(r.value)
			if n > len(b)-off {
				return nil, fmt.Errorf("%w: %s: record %#x of %d bytes at %d overruns the section", ErrFormat,
					sec.name, r.attr, n, off)
			}
			r.data = b[off : off+n]
			off += n
		default:
			return nil, fmt.Errorf("%w: %s: record format %d at %d", ErrFormat, sec.name, r.format, off-4)
		}
		out = append(out, r)
	}
	return out, nil
}

// moduleInfo reads the module-wide .nv.info attributes keyed by symbol index: registers and frame size.
type symAttrs struct{ registers, frame map[uint32]uint32 }

func (f *elfFile) moduleInfo() (symAttrs, error) {
	a := symAttrs{registers: map[uint32]uint32{}, frame: map[uint32]uint32{}}
	for _, s := range f.sections {
		if s.typ != shtCUDAInfo || s.info != 0 || !s.hasData {
			continue
		}
		recs, err := records(s)
		if err != nil {
			return a, err
		}
		for _, r := range recs {
			if r.format != 4 || len(r.data) < 8 {
				continue
			}
			switch r.attr {
			case attrRegCount:
				a.registers[u32(r.data, 0)] = u32(r.data, 4)
			case attrFrameSize:
				a.frame[u32(r.data, 0)] = u32(r.data, 4)
			}
		}
	}
	return a, nil
}

func (f *elfFile) kernels(out *File, info symAttrs) error {
	infoOf := map[uint32]section{}  // text section index -> its .nv.info.<kernel>
	sharedOf := map[uint32]uint64{} // text section index -> bytes of its .nv.shared.<kernel> sections
	var window uint64               // the reserved shared memory each kernel's section starts with
	for _, s := range f.sections {
		switch {
		case s.typ == shtCUDAInfo && s.info != 0 && s.hasData:
			infoOf[s.info] = s
		case strings.HasPrefix(s.name, ".nv.shared.reserved."):
			window = reservedSharedWindow
		case s.isNobits && strings.HasPrefix(s.name, ".nv.shared.") && s.info != 0:
			sharedOf[s.info] += min(s.size, 1<<40)
		}
	}
	for i, sym := range f.symbols {
		if sym.typ() != sttFunc || sym.other&stoCUDAEntry == 0 || sym.shndx == shnUndef {
			continue
		}
		k := Kernel{Name: sym.name, Registers: int(info.registers[uint32(i)]),
			LocalBytes: uint64(info.frame[uint32(i)])}
		if n, ok := sharedOf[sym.shndx]; ok {
			k.SharedBytes = n - min(n, window)
		}
		if k.Name == "" {
			return fmt.Errorf("%w: kernel symbol %d has no name", ErrFormat, i)
		}
		if sec, ok := infoOf[sym.shndx]; ok {
			if err := k.readInfo(sec); err != nil {
				return err
			}
		}
		out.Kernels = append(out.Kernels, k)
	}
	return nil
}

// readInfo reads a kernel's parameters and limits from its .nv.info.<kernel> section.
func (k *Kernel) readInfo(sec section) error {
	recs, err := records(sec)
	if err != nil {
		return err
	}
	type param struct {
		ordinal int
		p       device.Param
	}
	var params []param
	bankSize, haveBank := uint32(0), false
	for _, r := range recs {
		switch {
		case r.attr == attrKParamInfo && r.format == 4:
			if len(r.data) < 12 {
				return fmt.Errorf("%w: kernel %s: parameter record of %d bytes", ErrFormat, k.Name, len(r.data))
			}
			if len(params) >= maxParams {
				return fmt.Errorf("%w: kernel %s: more than %d parameters", ErrFormat, k.Name, maxParams)
			}
			params = append(params, param{ordinal: int(u16(r.data, 4)),
				p: device.Param{Offset: uint32(u16(r.data, 6)), Size: u32(r.data, 8) >> 18}})
		case r.attr == attrKParamInfoV2:
			return fmt.Errorf("%w: kernel %s: EIATTR_KPARAM_INFO_V2 is not understood", ErrFormat, k.Name)
		case r.attr == attrCBankParamSize && r.format == 3:
			bankSize, haveBank = uint32(r.value), true
		case (r.attr == attrMaxThreads || r.attr == attrReqNTID) && r.format == 4 && len(r.data) >= 12:
			n := uint64(u32(r.data, 0)) * uint64(u32(r.data, 4)) * uint64(u32(r.data, 8))
			if n > 0 && n <= 1<<20 && (k.MaxThreads == 0 || int(n) < k.MaxThreads) {
				k.MaxThreads = int(n)
			}
		}
	}
	slices.SortFunc(params, func(a, b param) int { return a.ordinal - b.ordinal })
	var end uint32
	for i, p := range params {
		if p.ordinal != i {
			return fmt.Errorf("%w: kernel %s: parameter ordinals %v are not 0..%d", ErrFormat, k.Name,
				ordinals(params, func(p param) int { return p.ordinal }), len(params)-1)
		}
		if p.p.Size == 0 {
			return fmt.Errorf("%w: kernel %s: parameter %d has size 0", ErrFormat, k.Name, i)
		}
		end = max(end, p.p.Offset+p.p.Size)
		k.Params = append(k.Params, p.p)
	}
	if haveBank && bankSize < end {
		return fmt.Errorf("%w: kernel %s: parameters end at %d, past the %d-byte argument buffer", ErrFormat, k.Name,
			end, bankSize)
	}
	k.ParamBytes = max(bankSize, end)
	return nil
}

func ordinals[T any](xs []T, f func(T) int) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}

// isDataSection: the sections whose symbols are module globals.
func isDataSection(name string) bool {
	if name == ".nv.global" || name == ".nv.global.init" {
		return true
	}
	bank, ok := strings.CutPrefix(name, ".nv.constant")
	if !ok || bank == "" || bank == "0" || len(bank) > 2 {
		return false
	}
	for _, c := range bank {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func (f *elfFile) data(out *File) error {
	dataOf := map[uint32]int{} // section index -> index in out.Data
	for _, s := range f.sections {
		if !isDataSection(s.name) || s.typ == 0 {
			continue
		}
		if s.size > 1<<40 {
			return fmt.Errorf("%w: %s of %d bytes", ErrFormat, s.name, s.size)
		}
		d := Data{Name: s.name, Size: s.size, Align: max(s.align, 1)}
		if d.Align&(d.Align-1) != 0 || d.Align > 1<<16 {
			return fmt.Errorf("%w: %s aligned to %d", ErrFormat, s.name, s.align)
		}
		if s.hasData && slices.ContainsFunc(s.data, func(b byte) bool { return b != 0 }) {
			d.Init = s.data
		}
		dataOf[uint32(s.index)] = len(out.Data)
		out.Data = append(out.Data, d)
	}
	for i, sym := range f.symbols {
		di, ok := dataOf[sym.shndx]
		if !ok || sym.typ() != sttObject || sym.name == "" {
			continue
		}
		d := out.Data[di]
		if sym.value > d.Size || sym.size > d.Size-sym.value {
			return fmt.Errorf("%w: global %s (symbol %d): %d bytes at %d outside %s of %d bytes", ErrFormat, sym.name,
				i, sym.size, sym.value, d.Name, d.Size)
		}
		out.Globals = append(out.Globals, Global{Name: sym.name, Data: di, Offset: sym.value, Size: sym.size,
			Constant: strings.HasPrefix(d.Name, ".nv.constant"), Managed: sym.other&stoCUDAManage != 0})
	}
	for _, s := range f.sections {
		if s.typ != shtRela && s.typ != shtRel {
			continue
		}
		di, ok := dataOf[s.info]
		if !ok {
			continue // relocations of code, debug information ...
		}
		if int(s.link) != f.symtab {
			return fmt.Errorf("%w: %s refers to symbol table %d", ErrFormat, s.name, s.link)
		}
		if err := f.relocs(out, s, di, dataOf); err != nil {
			return err
		}
	}
	return nil
}

func (f *elfFile) relocs(out *File, s section, di int, dataOf map[uint32]int) error {
	ent := uint64(relaSize)
	if s.typ == shtRel {
		ent = relSize
	}
	if !s.hasData || s.size%ent != 0 {
		return fmt.Errorf("%w: %s of %d bytes", ErrFormat, s.name, s.size)
	}
	d := &out.Data[di]
	for i := uint64(0); i < s.size/ent; i++ {
		b := s.data[i*ent:]
		off, info := u64(b, 0), u64(b, 8)
		typ, symIdx := uint32(info), info>>32
		var size int
		switch typ {
		case relCUDA32, relCUDAG32:
			size = 4
		case relCUDA64, relCUDAG64:
			size = 8
		default:
			continue
		}
		if off > d.Size || uint64(size) > d.Size-off {
			return fmt.Errorf("%w: %s: relocation %d writes %d bytes at %d of %s (%d bytes)", ErrFormat, s.name, i,
				size, off, d.Name, d.Size)
		}
		if symIdx >= uint64(len(f.symbols)) {
			return fmt.Errorf("%w: %s: relocation %d against symbol %d of %d", ErrFormat, s.name, i, symIdx,
				len(f.symbols))
		}
		var addend uint64
		if s.typ == shtRela {
			addend = u64(b, 16)
		} else if d.Init != nil { // SHT_REL: the addend is what the bytes hold
			if size == 4 {
				addend = uint64(u32(d.Init, off))
			} else {
				addend = u64(d.Init, off)
			}
		}
		sym := f.symbols[symIdx]
		r := Reloc{Offset: off, Size: size, Data: -1, Target: sym.value + addend, Symbol: sym.name}
		if t, ok := dataOf[sym.shndx]; ok {
			r.Data = t
			if r.Symbol == "" {
				r.Symbol = out.Data[t].Name // a section symbol
			}
		}
		d.Relocs = append(d.Relocs, r)
	}
	return nil
}

// Kernel returns the kernel called name.
func (f *File) Kernel(name string) (Kernel, bool) {
	for _, k := range f.Kernels {
		if k.Name == name {
			return k, true
		}
	}
	return Kernel{}, false
}

// Global returns the global called name (the first, should two compilation units both define a local one).
func (f *File) Global(name string) (Global, bool) {
	for _, g := range f.Globals {
		if g.Name == name {
			return g, true
		}
	}
	return Global{}, false
}
