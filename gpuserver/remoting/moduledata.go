package remoting

import (
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/cubin"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/fatbin"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/ptx"
)

// maxModuleEntryBytes bounds the uncompressed fat binary entry read for its data sections (the largest of the
// pinned CUDA 13 libraries is 39 MiB; the simulated device loads no larger).
const maxModuleEntryBytes = 256 << 20

// Limits of one session's handles: each is memory of the process that runs the session (and a driver object on a
// real GPU), and a module loaded again is loaded again on the GPU (its code, and its globals, which count against the
// function's quota). A call beyond them answers CUDA_ERROR_OUT_OF_MEMORY.
const (
	maxModules = 4096
	maxEvents  = 1 << 16
	maxStreams = 1 << 16
)

// moduleDataBytes is the GPU memory a module's globals take once it is loaded on a GPU of compute capability cc:
// the sizes of its data sections (a cubin's .nv.global, .nv.global.init and constant banks; PTX .global and .const
// variables), each aligned, from the entry a fat binary holds for that GPU. A module's data is GPU memory outside
// the function's segments, so it counts against the function's quota: a PTX module declaring a 64 GiB global loaded
// in a function with a 64 MiB quota, and the gpuserver's (or executor's) simulated device backed whatever the
// function wrote there with host memory.
func moduleDataBytes(image []byte, cc int) (uint64, error) {
	switch {
	case fatbin.IsFatbin(image):
		entries, _, err := fatbin.Parse(image)
		if err != nil {
			return 0, err
		}
		e, err := fatbin.Select(entries, cc)
		if err != nil {
			return 0, err
		}
		data, err := e.Data(maxModuleEntryBytes)
		if err != nil {
			return 0, err
		}
		switch e.Kind {
		case fatbin.KindELF:
			return cubinDataBytes(data)
		case fatbin.KindPTX:
			return ptxDataBytes(data)
		}
		return 0, fmt.Errorf("fat binary entry %s: neither a cubin nor PTX", e)
	case cubin.IsCubin(image):
		return cubinDataBytes(image)
	case ptx.IsPTX(image):
		return ptxDataBytes(image)
	}
	return 0, fmt.Errorf("neither PTX text, a cubin nor a fat binary")
}

func cubinDataBytes(image []byte) (uint64, error) {
	f, err := cubin.Parse(image)
	if err != nil {
		return 0, err
	}
	var total uint64
	for _, d := range f.Data {
		if total, err = addAligned(total, d.Size, d.Align); err != nil {
			return 0, err
		}
	}
	return total, nil
}

func ptxDataBytes(image []byte) (uint64, error) {
	globals, err := ptx.Globals(image)
	if err != nil {
		return 0, err
	}
	var total uint64
	for _, g := range globals {
		if total, err = addAligned(total, g.Size, g.Align); err != nil {
			return 0, err
		}
	}
	return total, nil
}

// addAligned places size bytes aligned to align after total bytes.
func addAligned(total, size, align uint64) (uint64, error) {
	const limit = 1 << 50 // far beyond any GPU: the arithmetic below cannot wrap
	align = max(align, 1)
	if size > limit || total > limit || align > limit {
		return 0, fmt.Errorf("module data of more than %d bytes", uint64(limit))
	}
	return (total+align-1)/align*align + size, nil
}
