// Package cu is the only cgo in faas-gpu's device layer: the CUDA driver API, loaded with dlopen at run time
// (no CUDA header or library is needed to build), wrapped so that each call sets the GPU's context current and
// makes the driver call inside one C call. Handles are opaque values; errors carry the driver's code and text.
package cu

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "cu.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Error is a CUDA driver error.
type Error struct {
	Code int
	Op   string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: CUDA error %d: %s", e.Op, e.Code, C.GoString(C.fg_error_string(C.CUresult(e.Code))))
}

// Well-known driver error codes.
const (
	ErrorInvalidValue   = 1
	ErrorOutOfMemory    = 2
	ErrorNotInitialized = 3
	ErrorNoDevice       = 100
	ErrorInvalidImage   = 200
	ErrorNotFound       = 500
	ErrorNotReady       = 600
	ErrorIllegalAddress = 700
	// Faults of a kernel: sticky for the context it ran in.
	ErrorLaunchTimeout       = 702
	ErrorAssert              = 710
	ErrorHardwareStackError  = 714
	ErrorIllegalInstruction  = 715
	ErrorMisalignedAddress   = 716
	ErrorInvalidAddressSpace = 717
	ErrorInvalidPC           = 718
	ErrorLaunchFailed        = 719
	ErrorPeerAccessUnsupp    = 217
	ErrorNotSupported        = 801
)

func check(op string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return &Error{Code: int(r), Op: op}
}

// Context, Stream, Event, Module and Function are driver handles.
type (
	Context  unsafe.Pointer
	Stream   unsafe.Pointer
	Event    unsafe.Pointer
	Module   unsafe.Pointer
	Function unsafe.Pointer
)

// Load opens the driver library (e.g. "libcuda.so.1") and initialises it.
func Load(path string) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	if C.fg_load(cpath, &buf[0], C.int(len(buf))) != 0 {
		return fmt.Errorf("load %s: %s", path, C.GoString(&buf[0]))
	}
	return check("cuInit", C.fg_init())
}

// DeviceCount is the number of GPUs.
func DeviceCount() (int, error) {
	var n C.int
	err := check("cuDeviceGetCount", C.fg_device_count(&n))
	return int(n), err
}

// Open retains GPU ordinal's primary context.
func Open(ordinal int) (int, Context, error) {
	var dev C.CUdevice
	var ctx C.CUcontext
	err := check("cuDevicePrimaryCtxRetain", C.fg_device_open(C.int(ordinal), &dev, &ctx))
	return int(dev), Context(ctx), err
}

// Close releases a GPU's primary context.
func Close(dev int) error {
	return check("cuDevicePrimaryCtxRelease", C.fg_device_close(C.CUdevice(dev)))
}

// Info describes a GPU.
type Info struct {
	Name, BusID        string
	Total, Granularity uint64
	Major, Minor       int
}

// DeviceInfo returns a GPU's name, bus id, memory, compute capability and VMM granularity.
func DeviceInfo(ctx Context, dev int) (Info, error) {
	var name [256]C.char
	var bus [64]C.char
	var total, gran C.size_t
	var major, minor C.int
	err := check("device info", C.fg_device_info(C.CUcontext(ctx), C.CUdevice(dev), &name[0], 256, &bus[0], 64,
		&total, &major, &minor, &gran))
	return Info{Name: C.GoString(&name[0]), BusID: C.GoString(&bus[0]), Total: uint64(total),
		Granularity: uint64(gran), Major: int(major), Minor: int(minor)}, err
}

// DeviceUUID returns a GPU's 16-byte UUID.
func DeviceUUID(dev int) ([16]byte, error) {
	var u [16]C.uchar
	err := check("device uuid", C.fg_device_uuid(C.CUdevice(dev), &u[0]))
	var out [16]byte
	for i := range u {
		out[i] = byte(u[i])
	}
	return out, err
}

// DeviceAttributes returns the values of attributes 1..n-1 (index 0 unused); an attribute the driver does not
// know reads 0.
func DeviceAttributes(dev, n int) ([]int32, error) {
	vals := make([]C.int, n)
	if err := check("device attributes", C.fg_device_attrs(C.CUdevice(dev), &vals[0], C.int(n))); err != nil {
		return nil, err
	}
	out := make([]int32, n)
	for i, v := range vals {
		out[i] = int32(v)
	}
	return out, nil
}

// CanAccessPeer reports whether dev can access peer's memory.
func CanAccessPeer(dev, peer int) (bool, error) {
	var can C.int
	err := check("cuDeviceCanAccessPeer", C.fg_can_access_peer(&can, C.CUdevice(dev), C.CUdevice(peer)))
	return can != 0, err
}

// MemInfo returns free and total memory of the context's GPU.
func MemInfo(ctx Context) (uint64, uint64, error) {
	var free, total C.size_t
	err := check("cuMemGetInfo", C.fg_mem_info(C.CUcontext(ctx), &free, &total))
	return uint64(free), uint64(total), err
}

// Reserve reserves address space.
func Reserve(ctx Context, size, align uint64) (uint64, error) {
	var p C.CUdeviceptr
	err := check("cuMemAddressReserve", C.fg_reserve(C.CUcontext(ctx), &p, C.size_t(size), C.size_t(align)))
	return uint64(p), err
}

// ReserveAt reserves address space with addr as the driver's placement hint; the driver may return another
// address (the caller checks).
func ReserveAt(ctx Context, size, align, addr uint64) (uint64, error) {
	var p C.CUdeviceptr
	err := check("cuMemAddressReserve", C.fg_reserve_at(C.CUcontext(ctx), &p, C.size_t(size), C.size_t(align),
		C.CUdeviceptr(addr)))
	return uint64(p), err
}

// AddressFree releases a reservation.
func AddressFree(ctx Context, p, size uint64) error {
	return check("cuMemAddressFree", C.fg_address_free(C.CUcontext(ctx), C.CUdeviceptr(p), C.size_t(size)))
}

// Create allocates physical memory on dev.
func Create(ctx Context, dev int, size uint64) (uint64, error) {
	var h C.CUmemGenericAllocationHandle
	err := check("cuMemCreate", C.fg_create(C.CUcontext(ctx), C.int(dev), C.size_t(size), &h))
	return uint64(h), err
}

// CreateShareable allocates physical memory on dev that another process can import (ExportFD).
func CreateShareable(ctx Context, dev int, size uint64) (uint64, error) {
	var h C.CUmemGenericAllocationHandle
	err := check("cuMemCreate", C.fg_create_shareable(C.CUcontext(ctx), C.int(dev), C.size_t(size), &h))
	return uint64(h), err
}

// ExportFD returns a new POSIX file descriptor of a shareable allocation (cuMemExportToShareableHandle); the caller
// closes it.
func ExportFD(ctx Context, h uint64) (int, error) {
	var fd C.int
	err := check("cuMemExportToShareableHandle", C.fg_export(C.CUcontext(ctx), C.CUmemGenericAllocationHandle(h), &fd))
	return int(fd), err
}

// ImportFD makes an allocation handle of a descriptor another process exported (cuMemImportFromShareableHandle);
// the descriptor stays the caller's.
func ImportFD(ctx Context, fd int) (uint64, error) {
	var h C.CUmemGenericAllocationHandle
	err := check("cuMemImportFromShareableHandle", C.fg_import(C.CUcontext(ctx), C.int(fd), &h))
	return uint64(h), err
}

// Release frees physical memory.
func Release(ctx Context, h uint64) error {
	return check("cuMemRelease", C.fg_release(C.CUcontext(ctx), C.CUmemGenericAllocationHandle(h)))
}

// Map maps a physical allocation at p.
func Map(ctx Context, p, size, offset, h uint64) error {
	return check("cuMemMap", C.fg_map(C.CUcontext(ctx), C.CUdeviceptr(p), C.size_t(size), C.size_t(offset),
		C.CUmemGenericAllocationHandle(h)))
}

// Unmap unmaps a range.
func Unmap(ctx Context, p, size uint64) error {
	return check("cuMemUnmap", C.fg_unmap(C.CUcontext(ctx), C.CUdeviceptr(p), C.size_t(size)))
}

// SetAccess grants read/write access to devs.
func SetAccess(ctx Context, p, size uint64, devs []int) error {
	return setAccess(ctx, p, size, devs, 3)
}

// SetAccessReadOnly grants devs read access to a mapped range (CU_MEM_ACCESS_FLAGS_PROT_READ).
func SetAccessReadOnly(ctx Context, p, size uint64, devs []int) error {
	return setAccess(ctx, p, size, devs, 1)
}

func setAccess(ctx Context, p, size uint64, devs []int, flags int) error {
	cdevs := make([]C.int, len(devs))
	for i, d := range devs {
		cdevs[i] = C.int(d)
	}
	if len(cdevs) == 0 {
		return &Error{Code: ErrorInvalidValue, Op: "cuMemSetAccess"}
	}
	return check("cuMemSetAccess", C.fg_set_access(C.CUcontext(ctx), C.CUdeviceptr(p), C.size_t(size), &cdevs[0],
		C.int(len(cdevs)), C.int(flags)))
}

// HostRegister page-locks host memory (not Go heap memory).
func HostRegister(ctx Context, p unsafe.Pointer, size uint64) error {
	return check("cuMemHostRegister", C.fg_host_register(C.CUcontext(ctx), p, C.size_t(size)))
}

// HostUnregister undoes HostRegister.
func HostUnregister(ctx Context, p unsafe.Pointer) error {
	return check("cuMemHostUnregister", C.fg_host_unregister(C.CUcontext(ctx), p))
}

// StreamCreate creates a non-blocking stream.
func StreamCreate(ctx Context) (Stream, error) {
	var s C.CUstream
	err := check("cuStreamCreate", C.fg_stream_create(C.CUcontext(ctx), &s))
	return Stream(s), err
}

// StreamDestroy destroys a stream.
func StreamDestroy(ctx Context, s Stream) error {
	return check("cuStreamDestroy", C.fg_stream_destroy(C.CUcontext(ctx), C.CUstream(s)))
}

// StreamSynchronize blocks until the stream's work completed.
func StreamSynchronize(ctx Context, s Stream) error {
	return check("cuStreamSynchronize", C.fg_stream_sync(C.CUcontext(ctx), C.CUstream(s)))
}

// StreamQuery reports completion (false, nil while work is pending).
func StreamQuery(ctx Context, s Stream) (bool, error) {
	r := C.fg_stream_query(C.CUcontext(ctx), C.CUstream(s))
	if r == ErrorNotReady {
		return false, nil
	}
	return true, check("cuStreamQuery", r)
}

// StreamWaitEvent makes the stream wait for an event.
func StreamWaitEvent(ctx Context, s Stream, e Event) error {
	return check("cuStreamWaitEvent", C.fg_stream_wait(C.CUcontext(ctx), C.CUstream(s), C.CUevent(e)))
}

// EventCreate creates an event without timing.
func EventCreate(ctx Context, timing bool) (Event, error) {
	var e C.CUevent
	err := check("cuEventCreate", C.fg_event_create(C.CUcontext(ctx), &e, boolInt(timing)))
	return Event(e), err
}

// EventElapsed returns the milliseconds between two completed timing events.
func EventElapsed(ctx Context, start, end Event) (float32, error) {
	var ms C.float
	err := check("cuEventElapsedTime", C.fg_event_elapsed(C.CUcontext(ctx), &ms, C.CUevent(start), C.CUevent(end)))
	return float32(ms), err
}

// EventRecord records an event on a stream.
func EventRecord(ctx Context, e Event, s Stream) error {
	return check("cuEventRecord", C.fg_event_record(C.CUcontext(ctx), C.CUevent(e), C.CUstream(s)))
}

// EventQuery reports completion (false, nil while pending).
func EventQuery(ctx Context, e Event) (bool, error) {
	r := C.fg_event_query(C.CUcontext(ctx), C.CUevent(e))
	if r == ErrorNotReady {
		return false, nil
	}
	return true, check("cuEventQuery", r)
}

// EventSynchronize blocks until the event completed.
func EventSynchronize(ctx Context, e Event) error {
	return check("cuEventSynchronize", C.fg_event_sync(C.CUcontext(ctx), C.CUevent(e)))
}

// EventDestroy destroys an event.
func EventDestroy(ctx Context, e Event) error {
	return check("cuEventDestroy", C.fg_event_destroy(C.CUcontext(ctx), C.CUevent(e)))
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// HtoD copies host memory to the device on s; with sync it waits for the stream (for memory the driver must not
// read after the call returns, such as Go heap memory).
func HtoD(ctx Context, dst uint64, src []byte, s Stream, sync bool) error {
	return check("cuMemcpyHtoDAsync", C.fg_htod(C.CUcontext(ctx), C.CUdeviceptr(dst), unsafe.Pointer(&src[0]),
		C.size_t(len(src)), C.CUstream(s), boolInt(sync)))
}

// DtoH copies device memory to host memory on s (see HtoD for sync).
func DtoH(ctx Context, dst []byte, src uint64, s Stream, sync bool) error {
	return check("cuMemcpyDtoHAsync", C.fg_dtoh(C.CUcontext(ctx), unsafe.Pointer(&dst[0]), C.CUdeviceptr(src),
		C.size_t(len(dst)), C.CUstream(s), boolInt(sync)))
}

// DtoD copies between device addresses (same GPU or peers) on s.
func DtoD(ctx Context, dst, src, n uint64, s Stream) error {
	return check("cuMemcpyAsync", C.fg_dtod(C.CUcontext(ctx), C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n),
		C.CUstream(s)))
}

// Memset8 sets bytes on s.
func Memset8(ctx Context, dst uint64, v uint8, n uint64, s Stream) error {
	return check("cuMemsetD8Async", C.fg_memset8(C.CUcontext(ctx), C.CUdeviceptr(dst), C.uchar(v), C.size_t(n),
		C.CUstream(s)))
}

// Memset32 sets 32-bit words on s.
func Memset32(ctx Context, dst uint64, v uint32, n uint64, s Stream) error {
	return check("cuMemsetD32Async", C.fg_memset32(C.CUcontext(ctx), C.CUdeviceptr(dst), C.uint(v), C.size_t(n),
		C.CUstream(s)))
}

// ModuleLoad loads a module image (PTX text must end with a NUL byte).
func ModuleLoad(ctx Context, image []byte) (Module, error) {
	cimg := C.CBytes(image)
	defer C.free(cimg)
	var m C.CUmodule
	err := check("cuModuleLoadData", C.fg_module_load(C.CUcontext(ctx), &m, cimg))
	return Module(m), err
}

// ModuleUnload unloads a module.
func ModuleUnload(ctx Context, m Module) error {
	return check("cuModuleUnload", C.fg_module_unload(C.CUcontext(ctx), C.CUmodule(m)))
}

// ModuleFunction looks a kernel up.
func ModuleFunction(ctx Context, m Module, name string) (Function, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var f C.CUfunction
	err := check("cuModuleGetFunction", C.fg_module_function(C.CUcontext(ctx), &f, C.CUmodule(m), cname))
	return Function(f), err
}

// ModuleGlobal looks a global up.
func ModuleGlobal(ctx Context, m Module, name string) (uint64, uint64, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var p C.CUdeviceptr
	var size C.size_t
	err := check("cuModuleGetGlobal", C.fg_module_global(C.CUcontext(ctx), &p, &size, C.CUmodule(m), cname))
	return uint64(p), uint64(size), err
}

// ParamInfo returns the kernel's parameter offsets and sizes; ok is false when the driver cannot tell (< 12.4).
func ParamInfo(ctx Context, f Function) (offsets, sizes []uint64, ok bool) {
	for i := 0; ; i++ {
		var off, size C.size_t
		switch C.fg_param_info(C.CUcontext(ctx), C.CUfunction(f), C.size_t(i), &off, &size) {
		case 1:
			offsets, sizes = append(offsets, uint64(off)), append(sizes, uint64(size))
		case 0:
			return offsets, sizes, true
		default:
			return nil, nil, false
		}
	}
}

// Launch launches a kernel with a raw argument buffer.
func Launch(ctx Context, f Function, grid, block [3]uint32, shared uint32, s Stream, args []byte) error {
	var p unsafe.Pointer
	if len(args) > 0 {
		p = unsafe.Pointer(&args[0])
	}
	return check("cuLaunchKernel", C.fg_launch(C.CUcontext(ctx), C.CUfunction(f), C.uint(grid[0]), C.uint(grid[1]),
		C.uint(grid[2]), C.uint(block[0]), C.uint(block[1]), C.uint(block[2]), C.uint(shared), C.CUstream(s), p,
		C.size_t(len(args))))
}
