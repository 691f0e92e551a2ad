package sim

import (
	"errors"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cubin"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/fatbin"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/ptx"
)

// maxEntryBytes bounds the uncompressed size of the fat binary entry a module is loaded from (the largest of the
// pinned CUDA 13 libraries is 39 MiB).
const maxEntryBytes = 256 << 20

// image is what the sim loads from any module image: kernels, and module globals in data segments.
type image struct {
	// source says what was loaded: "ptx", "cubin sm_90", "fatbin entry 3: cubin sm_90, ...".
	source   string
	kernels  []kernelDecl
	segments []dataSegment
	globals  []globalDecl
}

type kernelDecl struct {
	name   string
	params []device.Param
	attrs  device.FunctionAttributes
}

// dataSegment is a data section (a cubin's .nv.global, .nv.global.init ...; one per variable for PTX).
type dataSegment struct {
	name        string
	size, align uint64
	init        []byte // the first len(init) bytes; the rest are zero
	relocs      []segReloc
}

// segReloc writes the address of byte target of dataSegment seg into size bytes at off.
type segReloc struct {
	off    uint64
	size   int
	seg    int
	target uint64
}

type globalDecl struct {
	name      string
	seg       int
	off, size uint64
}

// decodeImage reads a PTX, cubin or fat binary image for a GPU of compute capability cc.
func decodeImage(img []byte, cc int) (*image, error) {
	switch {
	case len(img) == 0:
		return nil, fmt.Errorf("%w: empty image", device.ErrInvalidImage)
	case fatbin.IsWrapper(img):
		return nil, fmt.Errorf("%w: a __fatBinC_Wrapper_t (magic %#x) holds host pointers; load the fat binary it "+
			"points to", device.ErrInvalidImage, uint32(fatbin.WrapperMagic))
	case fatbin.IsFatbin(img):
		entries, _, err := fatbin.Parse(img)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", device.ErrInvalidImage, err)
		}
		e, err := fatbin.Select(entries, cc)
		if errors.Is(err, fatbin.ErrNoBinaryForGPU) {
			return nil, fmt.Errorf("%w: %w", device.ErrNoBinaryForGPU, err)
		} else if err != nil {
			return nil, fmt.Errorf("%w: %w", device.ErrInvalidImage, err)
		}
		data, err := e.Data(maxEntryBytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", device.ErrInvalidImage, err)
		}
		var im *image
		switch e.Kind {
		case fatbin.KindELF:
			im, err = decodeCubin(data, cc)
		case fatbin.KindPTX:
			im, err = decodePTX(data)
		default:
			err = fmt.Errorf("%w: %s", device.ErrInvalidImage, e)
		}
		if err != nil {
			return nil, err
		}
		im.source = "fatbin " + e.String()
		return im, nil
	case cubin.IsCubin(img):
		return decodeCubin(img, cc)
	case ptx.IsPTX(img):
		return decodePTX(img)
	}
	return nil, fmt.Errorf("%w: neither PTX text, a cubin nor a fat binary (starts with % x)", device.ErrInvalidImage,
		img[:min(len(img), 8)])
}

// decodeCubin reads a cubin; one for another architecture fails as on the driver: a cubin for X.Y runs on X.Z
// with Z >= Y.
func decodeCubin(b []byte, cc int) (*image, error) {
	f, err := cubin.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", device.ErrInvalidImage, err)
	}
	if f.Arch != 0 && (f.Arch/10 != cc/10 || f.Arch > cc) {
		return nil, fmt.Errorf("%w: a cubin for sm_%d does not run on compute capability %d.%d",
			device.ErrNoBinaryForGPU, f.Arch, cc/10, cc%10)
	}
	im := &image{source: fmt.Sprintf("cubin sm_%d", f.Arch)}
	for _, k := range f.Kernels {
		im.kernels = append(im.kernels, kernelDecl{name: k.Name, params: k.Params, attrs: device.FunctionAttributes{
			MaxThreadsPerBlock: k.MaxThreads, SharedSizeBytes: k.SharedBytes, LocalSizeBytes: k.LocalBytes,
			NumRegs: k.Registers, BinaryVersion: f.Arch}})
	}
	// Only the data sections that hold globals (and those their initial addresses point into) get memory: the
	// compiler's own banks (.nv.constant4's address table) matter to code the sim does not execute.
	keep := make([]bool, len(f.Data))
	for _, g := range f.Globals {
		keep[g.Data] = true
	}
	for changed := true; changed; {
		changed = false
		for i, d := range f.Data {
			for _, r := range d.Relocs {
				if keep[i] && r.Data >= 0 && !keep[r.Data] {
					keep[r.Data], changed = true, true
				}
			}
		}
	}
	index := make([]int, len(f.Data))
	for i, d := range f.Data {
		index[i] = -1
		if keep[i] {
			index[i] = len(im.segments)
			im.segments = append(im.segments, dataSegment{name: d.Name, size: d.Size, align: d.Align, init: d.Init})
		}
	}
	for i, d := range f.Data {
		if !keep[i] {
			continue
		}
		s := &im.segments[index[i]]
		for _, r := range d.Relocs {
			if r.Data >= 0 {
				s.relocs = append(s.relocs, segReloc{off: r.Offset, size: r.Size, seg: index[r.Data], target: r.Target})
			}
		}
	}
	for _, g := range f.Globals {
		im.globals = append(im.globals, globalDecl{name: g.Name, seg: index[g.Data], off: g.Offset, size: g.Size})
	}
	return im, nil
}

// decodePTX reads PTX text: the sim compiles nothing, so "just in time compilation" is reading the entries'
// parameter layouts and the module variables. Its .target is not checked against the GPU.
func decodePTX(b []byte) (*image, error) {
	entries, err := ptx.Entries(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", device.ErrInvalidImage, err)
	}
	globals, err := ptx.Globals(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", device.ErrInvalidImage, err)
	}
	im := &image{source: "ptx"}
	for _, e := range entries {
		im.kernels = append(im.kernels, kernelDecl{name: e.Name, params: e.Params})
	}
	index := map[string]int{}
	for i, g := range globals {
		index[g.Name] = i
	}
	for i, g := range globals {
		s := dataSegment{name: g.Name, size: g.Size, align: g.Align, init: g.Init}
		for _, r := range g.Relocs {
			if t, ok := index[r.Symbol]; ok { // an address of a function has no place on the simulated device
				s.relocs = append(s.relocs, segReloc{off: r.Offset, size: r.Size, seg: t, target: uint64(r.Addend)})
			}
		}
		im.segments = append(im.segments, s)
		im.globals = append(im.globals, globalDecl{name: g.Name, seg: i, size: g.Size})
	}
	return im, nil
}
