package device

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/faas-gpu/faas-gpu/gpuserver/device/attrs"
)

// Ptr is a device virtual address in the node's unified address space. 0 is never a valid block address.
type Ptr uint64

// Backend is a node's GPUs behind one driver.
type Backend interface {
	// Kind names the backend: "cuda" or "sim".
	Kind() string
	// GPUs describes every GPU of the node, indexed from 0.
	GPUs() []GPUInfo
	// CanAccessPeer reports whether GPU gpu can read and write physical memory of GPU peer (peer copies,
	// SetAccess for gpu on peer's memory). It is false for gpu == peer.
	CanAccessPeer(gpu, peer int) bool

	// ReserveAddress reserves size bytes of device address space aligned to alignment (0 means the granularity);
	// size must be a multiple of the largest GPU granularity. The range is valid on every GPU.
	ReserveAddress(size, alignment uint64) (Ptr, error)
	// ReserveAddressAt reserves exactly [ptr, ptr+size) (ptr and size multiples of the largest granularity), so
	// that addresses recorded before a restart (a model image's segments) are valid again. It fails, reserving
	// nothing, when the range is not free (device.ErrOutOfMemory) or the driver would place it elsewhere.
	ReserveAddressAt(ptr Ptr, size uint64) (Ptr, error)
	// FreeAddress releases a whole reservation; nothing may be mapped in it any more.
	FreeAddress(ptr Ptr, size uint64) error

	// CreatePhysical allocates size bytes of physical memory on GPU gpu; size must be a multiple of the GPU's
	// Granularity. Its content is undefined.
	CreatePhysical(gpu int, size uint64) (Physical, error)
	// Map maps the whole of phys at ptr, which must lie inside a reservation and be aligned to the granularity.
	// The range [ptr, ptr+phys.Size()) must not be mapped already. Map grants no access: call SetAccess.
	Map(ptr Ptr, phys Physical) error
	// SetAccess makes the mapped range [ptr, ptr+size) readable and writable from each GPU in gpus (the GPU that
	// owns the physical memory, and peers for which CanAccessPeer holds).
	SetAccess(ptr Ptr, size uint64, gpus []int) error
	// Unmap removes the mappings in [ptr, ptr+size), which must cover whole mappings. Work still queued that
	// touches the range must have completed (synchronize first); the physical memory stays allocated.
	Unmap(ptr Ptr, size uint64) error

	// RegisterHost page-locks host memory (not from the Go heap: an mmap'ed region) so that copies from and to
	// it run asynchronously. UnregisterHost undoes it.
	RegisterHost(buf []byte) error
	UnregisterHost(buf []byte) error

	// NewContext creates an isolation domain on GPU gpu (see Context). NewStream, NewEvent and LoadModule below
	// work in the backend's own context of each GPU (the CUDA primary context), which holds the physical memory
	// and runs the gpuserver's own copies; tenants' work belongs in contexts of their own.
	NewContext(gpu int) (Context, error)
	// NewStream creates a stream of asynchronous work on GPU gpu.
	NewStream(gpu int) (Stream, error)
	// NewEvent creates an event on GPU gpu, for Stream.Record and Stream.Wait.
	NewEvent(gpu int) (Event, error)
	// NewTimedEvent creates an event that also records when the work before it completed (Event.Elapsed).
	NewTimedEvent(gpu int) (Event, error)
	// LoadModule loads a module image (PTX text or cubin) on GPU gpu.
	LoadModule(gpu int, image []byte) (Module, error)
	// MemoryInfo returns the free and total physical memory of GPU gpu as the driver sees it.
	MemoryInfo(gpu int) (free, total uint64, err error)

	// Close releases the backend; every object created from it becomes invalid.
	Close(ctx context.Context) error
}

// GPUInfo describes one GPU.
type GPUInfo struct {
	// Index of the GPU in Backend.GPUs.
	Index int `json:"index"`
	// Name is the device's model name, e.g. "NVIDIA H200" or "Tesla V100-SXM2-32GB (simulated)".
	Name string `json:"name"`
	// UUID of the device ("GPU-..."), empty on the sim.
	UUID string `json:"uuid,omitempty"`
	// PCIBusID is the device's PCI bus id, e.g. "0000:3b:00.0".
	PCIBusID string `json:"pci_bus_id,omitempty"`
	// MemoryBytes is the device's total memory.
	MemoryBytes uint64 `json:"memory_bytes"`
	// Granularity is the size and alignment unit of physical allocations and mappings (2 MiB on current GPUs).
	Granularity uint64 `json:"granularity"`
	// ComputeCapability is major*10+minor, e.g. 90 for an H200.
	ComputeCapability int `json:"compute_capability"`
	// Attributes is the GPU's complete device attribute table (every CUdevice_attribute): the driver's on a
	// real GPU, the simulated model's on the sim (package attrs).
	Attributes attrs.Table `json:"-"`
}

// FormatUUID renders a 16-byte GPU UUID as the driver and nvidia-smi do: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func FormatUUID(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// ParseUUID parses a UUID as FormatUUID writes it (the GPU- prefix optional).
func ParseUUID(s string) ([16]byte, error) {
	var u [16]byte
	h := strings.ReplaceAll(strings.TrimPrefix(s, "GPU-"), "-", "")
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != 16 {
		return u, fmt.Errorf("%w: GPU UUID %q", ErrInvalidValue, s)
	}
	copy(u[:], b)
	return u, nil
}

// ReadOnlyAccess is a Backend that can map memory read-only: SetAccessReadOnly grants gpus read access to the
// mapped range [ptr, ptr+size) and takes write access away, so that work writing there faults (a chunk shared by
// several functions' mappings).
type ReadOnlyAccess interface {
	SetAccessReadOnly(ptr Ptr, size uint64, gpus []int) error
}

// Physical is physical memory on one GPU (a CUDA allocation handle).
type Physical interface {
	// GPU owning the memory.
	GPU() int
	// Size in bytes.
	Size() uint64
	// Release frees the memory; it must not be mapped any more.
	Release() error
}

// RangeMapper is a Backend that maps part of a physical allocation (cuMemMap with an offset): MapRange maps
// [offset, offset+size) of phys at ptr, both multiples of the granularity, under the same rules as Map. A pool that
// carves chunks out of larger allocations maps a run of them with one call.
type RangeMapper interface {
	MapRange(ptr Ptr, phys Physical, offset, size uint64) error
}
