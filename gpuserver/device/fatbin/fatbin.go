// Package fatbin reads NVIDIA fat binaries: the containers nvcc and the NVIDIA libraries (PyTorch's
// libtorch_cuda, cuBLAS, cuBLASLt, cuDNN) embed in their .nv_fatbin sections and hand to the driver through
// cuModuleLoadData, cuModuleLoadFatBinary and cuLibraryLoadData. It is pure Go and reads untrusted bytes: every
// size is checked against the image before it is used, and no input makes it panic.
//
// # Layout
//
// A fat binary is a 16-byte header followed by entries:
//
//	header: u32 magic 0xBA55ED50, u16 version 1, u16 header size (16), u64 size of the entries that follow
//	entry:  u16 kind (1 PTX, 2 ELF cubin), u16 0x0101, u32 entry header size (64, 80, 104 or 112 bytes),
//	        u64 payload size (the bytes after the entry header, padded to 8), u32 compressed size (0: stored),
//	        u32 offset of the extended header (0 or 64), u16 minor and u16 major code version (PTX ISA 9.0, ELF
//	        1.8), u32 arch (90 for sm_90 / compute_90), u32 name offset, u32 name length, u64 flags,
//	        u64 reserved, u64 uncompressed size (0: stored); then extended fields up to the entry header size.
//
// So a container's size is 16 plus its header's size field: that is how many bytes the shim reads from a fatbin
// pointer (a library's .nv_fatbin section holds many containers back to back, each registered on its own; only
// the first container of an image is read). The flag bits used here are 0x2000 (payload compressed with LZ4's
// block format: nvcc --compress-mode=speed), 0x8000 (payload compressed with Zstandard: CUDA 13's default for
// every compressed entry and --compress-mode=size/balance), 0x100000 (an arch-specific target, sm_90a) and
// 0x200000 (a family-specific target, sm_100f). CUDA 13 compresses by default (small entries are stored): every
// ELF entry of the pinned CUDA 13 wheels (libtorch_cuda, libcublas, libcublasLt, libcudnn_*) is Zstandard. Zstandard
// frames are decoded with github.com/klauspost/compress/zstd; the LZ4 block format is decoded here.
//
// A __fatBinC_Wrapper_t (magic 0x466243B1, what __cudaRegisterFatBinary receives) holds host pointers, not a fat
// binary: IsWrapper recognises it so that callers can say so.
//
// # Choosing an entry
//
// Select picks the entry the CUDA driver would load on a GPU of a given compute capability: a cubin of the same
// major version whose minor version is at most the GPU's (an arch-specific sm_XYa cubin only on exactly X.Y), the
// highest such, and the most specific on a tie (arch-specific, then family-specific, then plain); else the PTX of
// the highest virtual architecture not above the GPU's, which the driver compiles just in time; else
// ErrNoBinaryForGPU.
package fatbin

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Magic starts every fat binary.
const Magic = 0xBA55ED50

// WrapperMagic starts a __fatBinC_Wrapper_t, the host-side structure pointing at a fat binary.
const WrapperMagic = 0x466243B1

// Sizes of the fixed headers.
const (
	HeaderSize      = 16
	EntryHeaderSize = 64
	// maxEntryHeader bounds an entry header's declared size (the largest seen is 112 bytes).
	maxEntryHeader = 4096
)

// Flag bits of an entry.
const (
	FlagCompressedLZ4  = 0x2000
	FlagCompressedZstd = 0x8000
	FlagArchSpecific   = 0x100000
	FlagFamilySpecific = 0x200000
)

// Kind is what an entry holds.
type Kind uint16

// Entry kinds.
const (
	KindPTX Kind = 1
	KindELF Kind = 2
)

func (k Kind) String() string {
	switch k {
	case KindPTX:
		return "ptx"
	case KindELF:
		return "cubin"
	}
	return fmt.Sprintf("kind(%d)", uint16(k))
}

// Errors; every error of the package wraps one of them.
var (
	// ErrFormat: the bytes are not a well-formed fat binary.
	ErrFormat = errors.New("malformed fat binary")
	// ErrNoBinaryForGPU: no entry can run on the GPU (CUDA_ERROR_NO_BINARY_FOR_GPU).
	ErrNoBinaryForGPU = errors.New("no binary for the GPU")
	// ErrTooLarge: an entry decompresses to more than the caller's limit.
	ErrTooLarge = errors.New("fat binary entry too large")
)

// Entry is one code object of a fat binary.
type Entry struct {
	// Index of the entry in its fat binary, from 0.
	Index int
	Kind  Kind
	// Arch is the target architecture as major*10+minor: 90 for sm_90, sm_90a and compute_90.
	Arch int
	// Flags as stored (see the Flag constants).
	Flags uint64
	// CodeVersion is the PTX ISA version of a PTX entry (major, minor), the ELF ABI version of a cubin.
	CodeVersion [2]uint16
	// payload is the entry's stored bytes (compressed or not, without padding).
	payload []byte
	// size is the uncompressed size (len(payload) when stored).
	size uint64
}

// ArchSpecific reports an sm_XYa / compute_XYa target, which runs only on exactly that architecture.
func (e Entry) ArchSpecific() bool { return e.Flags&FlagArchSpecific != 0 }

// FamilySpecific reports an sm_XYf target, which runs on the architectures of its family (same major, minor at
// least its own).
func (e Entry) FamilySpecific() bool { return e.Flags&FlagFamilySpecific != 0 }

// Compression names how the payload is stored: "none", "lz4" or "zstd".
func (e Entry) Compression() string {
	switch {
	case e.Flags&FlagCompressedZstd != 0:
		return "zstd"
	case e.Flags&FlagCompressedLZ4 != 0:
		return "lz4"
	}
	return "none"
}

// Size is the entry's uncompressed size in bytes, as its header declares it.
func (e Entry) Size() uint64 { return e.size }

// Target names the entry's target the way nvcc spells it: sm_90, sm_90a, sm_100f, compute_90.
func (e Entry) Target() string {
	prefix := "sm_"
	if e.Kind == KindPTX {
		prefix = "compute_"
	}
	suffix := ""
	switch {
	case e.ArchSpecific():
		suffix = "a"
	case e.FamilySpecific():
		suffix = "f"
	}
	return fmt.Sprintf("%s%d%s", prefix, e.Arch, suffix)
}

func (e Entry) String() string {
	return fmt.Sprintf("entry %d: %s %s, %d bytes (%s)", e.Index, e.Kind, e.Target(), e.size, e.Compression())
}

// IsFatbin reports whether image starts with a fat binary header.
func IsFatbin(image []byte) bool {
	return len(image) >= 4 && binary.LittleEndian.Uint32(image) == Magic
}

// IsWrapper reports whether image starts with a __fatBinC_Wrapper_t (host pointers, not a fat binary).
func IsWrapper(image []byte) bool {
	return len(image) >= 4 && binary.LittleEndian.Uint32(image) == WrapperMagic
}

// Parse reads the entries of the fat binary at the start of image (bytes after it are ignored) and returns them
// with the container's size. Payloads are not decompressed (see Entry.Data).
func Parse(image []byte) ([]Entry, uint64, error) {
	if len(image) < HeaderSize {
		return nil, 0, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrFormat, len(image), HeaderSize)
	}
	if m := binary.LittleEndian.Uint32(image); m != Magic {
		return nil, 0, fmt.Errorf("%w: magic %#x, want %#x", ErrFormat, m, uint32(Magic))
	}
	hdr := uint64(binary.LittleEndian.Uint16(image[6:]))
	body := binary.LittleEndian.Uint64(image[8:])
	if hdr < HeaderSize || hdr > uint64(len(image)) {
		return nil, 0, fmt.Errorf("%w: header size %d", ErrFormat, hdr)
	}
	if body > uint64(len(image))-hdr {
		return nil, 0, fmt.Errorf("%w: header declares %d bytes of entries, the image has %d after the header",
			ErrFormat, body, uint64(len(image))-hdr)
	}
	end := hdr + body
	var entries []Entry
	for off := hdr; off < end; {
		if end-off < EntryHeaderSize {
			return nil, 0, fmt.Errorf("%w: %d trailing bytes at offset %d, shorter than an entry header", ErrFormat,
				end-off, off)
		}
		h := image[off:end]
		ehs := uint64(binary.LittleEndian.Uint32(h[4:]))
		psize := binary.LittleEndian.Uint64(h[8:])
		csize := uint64(binary.LittleEndian.Uint32(h[16:]))
		if ehs < EntryHeaderSize || ehs > maxEntryHeader || ehs > uint64(len(h)) {
			return nil, 0, fmt.Errorf("%w: entry %d at offset %d: header size %d", ErrFormat, len(entries), off, ehs)
		}
		if psize > uint64(len(h))-ehs {
			return nil, 0, fmt.Errorf("%w: entry %d at offset %d: payload of %d bytes overruns the container",
				ErrFormat, len(entries), off, psize)
		}
		e := Entry{
			Index:       len(entries),
			Kind:        Kind(binary.LittleEndian.Uint16(h)),
			CodeVersion: [2]uint16{binary.LittleEndian.Uint16(h[26:]), binary.LittleEndian.Uint16(h[24:])},
			Flags:       binary.LittleEndian.Uint64(h[40:]),
		}
		arch := binary.LittleEndian.Uint32(h[28:])
		if arch > 10000 {
			return nil, 0, fmt.Errorf("%w: entry %d: arch %d", ErrFormat, e.Index, arch)
		}
		e.Arch = int(arch)
		payload := h[ehs : ehs+psize]
		if e.Flags&(FlagCompressedLZ4|FlagCompressedZstd) != 0 {
			if csize > psize {
				return nil, 0, fmt.Errorf("%w: entry %d: compressed size %d exceeds its payload of %d bytes",
					ErrFormat, e.Index, csize, psize)
			}
			e.payload = payload[:csize]
			e.size = binary.LittleEndian.Uint64(h[56:])
		} else {
			e.payload = payload
			e.size = psize
		}
		entries = append(entries, e)
		off += ehs + psize
	}
	return entries, end, nil
}

// Data returns the entry's uncompressed bytes; an entry that would decompress to more than limit bytes fails with
// ErrTooLarge before anything is allocated. A stored entry's bytes alias the image.
func (e Entry) Data(limit uint64) ([]byte, error) {
	if e.size > limit {
		return nil, fmt.Errorf("%w: %s: %d bytes, limit %d", ErrTooLarge, e, e.size, limit)
	}
	var out []byte
	var err error
	switch e.Compression() {
	case "zstd":
		out, err = unzstd(e.payload, e.size)
	case "lz4":
		out, err = unlz4(e.payload, e.size)
	default:
		return e.payload, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrFormat, e, err)
	}
	if uint64(len(out)) != e.size {
		return nil, fmt.Errorf("%w: %s: decompressed to %d bytes, header declares %d", ErrFormat, e, len(out), e.size)
	}
	return out, nil
}

// Select returns the entry the driver loads on a GPU of compute capability cc (major*10+minor): see the package
// documentation. It fails with ErrNoBinaryForGPU naming what the fat binary holds.
func Select(entries []Entry, cc int) (Entry, error) {
	best, found := Entry{}, false
	for _, e := range entries {
		if e.Kind != KindELF || !cubinRuns(e, cc) {
			continue
		}
		if !found || e.Arch > best.Arch || e.Arch == best.Arch && specificity(e) > specificity(best) {
			best, found = e, true
		}
	}
	if found {
		return best, nil
	}
	for _, e := range entries {
		if e.Kind != KindPTX || e.Arch > cc || e.ArchSpecific() && e.Arch != cc ||
			e.FamilySpecific() && e.Arch/10 != cc/10 {
			continue
		}
		if !found || e.Arch > best.Arch || e.Arch == best.Arch && specificity(e) > specificity(best) {
			best, found = e, true
		}
	}
	if found {
		return best, nil
	}
	var have []string
	for _, e := range entries {
		have = append(have, e.Target())
	}
	return Entry{}, fmt.Errorf("%w: compute capability %d.%d, the fat binary holds %v", ErrNoBinaryForGPU, cc/10,
		cc%10, have)
}

// cubinRuns: a cubin for X.Y runs on X.Z with Z >= Y; an arch-specific one only on X.Y.
func cubinRuns(e Entry, cc int) bool {
	if e.Arch/10 != cc/10 || e.Arch > cc {
		return false
	}
	return !e.ArchSpecific() || e.Arch == cc
}

func specificity(e Entry) int {
	switch {
	case e.ArchSpecific():
		return 2
	case e.FamilySpecific():
		return 1
	}
	return 0
}
