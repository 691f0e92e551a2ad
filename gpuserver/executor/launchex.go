package executor

import (
	"encoding/binary"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// kernelPointers are the values of a kernel's 8-byte parameters: the device addresses a launch may touch.
func kernelPointers(f device.Function, args []byte) []device.Ptr {
	var ptrs []device.Ptr
	for _, p := range f.Params() {
		if p.Size == 8 && int(p.Offset)+8 <= len(args) {
			ptrs = append(ptrs, device.Ptr(binary.LittleEndian.Uint64(args[p.Offset:])))
		}
	}
	return ptrs
}

// LaunchEx is Launch with launch attributes (cuLaunchKernelEx); ErrNotSupported when the device's streams take
// none.
func (s *Stream) LaunchEx(f device.Function, grid, block device.Dim3, sharedMem uint32,
	attrs []device.LaunchAttribute, args []byte) error {
	xl, ok := s.s.(device.ExtendedLauncher)
	if !ok {
		return fmt.Errorf("%w: launch attributes on gpu %d", device.ErrNotSupported, s.gpu)
	}
	ptrs := kernelPointers(f, args)
	return s.gate(func() error {
		s.n.writesLocked(s.f, "kernel", ptrs...)
		return xl.LaunchEx(f, grid, block, sharedMem, attrs, args)
	}, ptrs...)
}
