package cuda

import (
	"fmt"
	"os"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/attrs"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda/cu"
)

// Physical memory shared between processes (device.Sharer, docs/tenants.md): the gpuserver creates every chunk
// shareable (EnableSharing before the first CreatePhysical: cuMemCreate with a POSIX file descriptor handle type),
// exports each one it lends to a tenant executor (cuMemExportToShareableHandle), and the executor imports it
// (cuMemImportFromShareableHandle) and maps it at its functions' fixed addresses with its own cuMemMap and
// cuMemSetAccess. The allocation lives until both processes released their handles; an executor that dies drops
// its handles with its process.

var _ device.Sharer = (*Backend)(nil)

// EnableSharing makes later CreatePhysical allocations shareable with other processes; it fails when a GPU cannot
// export POSIX file descriptors (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED).
func (b *Backend) EnableSharing() error {
	for _, g := range b.gpus {
		if g.info.Attributes[attrs.HandleTypePosixFileDescriptorSupported] == 0 {
			return fmt.Errorf("cuda: %w: gpu %d cannot share memory by file descriptor (tenant executors need it)",
				device.ErrNotSupported, g.info.Index)
		}
	}
	b.mu.Lock()
	b.shareable = true
	b.mu.Unlock()
	return nil
}

// ExportPhysical returns a POSIX file descriptor of a physical allocation made shareable.
func (b *Backend) ExportPhysical(phys device.Physical) (*os.File, error) {
	p, ok := phys.(*physical)
	if !ok || p.b != b {
		return nil, fmt.Errorf("%w: physical memory of another backend", device.ErrInvalidValue)
	}
	fd, err := cu.ExportFD(b.gpus[p.gpu].ctx, p.handle)
	if err != nil {
		return nil, fmt.Errorf("gpu %d: %w", p.gpu, wrap(err))
	}
	return os.NewFile(uintptr(fd), "cuda-physical"), nil
}

// ImportPhysical imports physical memory of GPU gpu another process exported.
func (b *Backend) ImportPhysical(gpu int, size uint64, f *os.File) (device.Physical, error) {
	g, err := b.gpu(gpu)
	if err != nil {
		return nil, err
	}
	if size == 0 || size%g.info.Granularity != 0 {
		return nil, fmt.Errorf("%w: physical size %d is not a multiple of %d", device.ErrInvalidValue, size,
			g.info.Granularity)
	}
	h, err := cu.ImportFD(g.ctx, int(f.Fd()))
	if err != nil {
		return nil, fmt.Errorf("gpu %d: %w", gpu, wrap(err))
	}
	return &physical{b: b, gpu: gpu, size: size, handle: h}, nil
}
