package remoting

import (
	"context"
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Memory: blocks from the executor node at fixed addresses, and what the driver says about them.

// allocation is a block the session allocated (or a module global it may copy to).
type allocation struct {
	ptr, size  uint64
	global     *global // set for a module global: the address is the one on the GPU it was first asked on
	ownSegment bool    // the block has a segment of its own (never shared with later blocks)
	segSize    uint64  // bytes of the segment it created, if any (counted in used)
	mapped     bool    // a mapping of a physical allocation (cuMemMap): freed by cuMemUnmap only
}

func (h *deviceHandler) CuMemAlloc_v2(ctx context.Context, size uint64) (uint64, Result) {
	if size == 0 {
		return 0, ResultInvalidValue
	}
	if _, r := h.bind(ctx); r != ResultSuccess {
		return 0, r
	}
	ptr, seg, created, err := h.node.AllocSegment(ctx, h.info.Function, size, h.phase())
	if err != nil {
		return 0, result(err)
	}
	a := allocation{ptr: uint64(ptr), size: size, ownSegment: created && seg.Ptr == ptr &&
		size >= h.node.ChunkSize()/2}
	if created {
		if !h.chargeDevice(seg.Size) {
			_ = h.node.Free(h.info.Function, ptr)
			return 0, ResultOutOfMemory
		}
		a.segSize = seg.Size
	}
	h.addAllocation(a)
	return uint64(ptr), ResultSuccess
}

func (h *deviceHandler) CuMemAllocAsync(ctx context.Context, size, _ uint64) (uint64, Result) {
	return h.CuMemAlloc_v2(ctx, size)
}

func (h *deviceHandler) CuMemFree_v2(ctx context.Context, dptr uint64) Result {
	i := h.findAllocation(dptr)
	if i < 0 || h.allocs[i].ptr != dptr || h.allocs[i].global != nil || h.allocs[i].mapped {
		return ResultInvalidValue
	}
	if r := h.syncStream(ctx); r != ResultSuccess {
		return r
	}
	a := h.allocs[i]
	if err := h.node.Free(h.info.Function, device.Ptr(dptr)); err != nil {
		return result(err)
	}
	h.allocs = append(h.allocs[:i], h.allocs[i+1:]...)
	if a.ownSegment { // its chunks went back to the pools; its address stays reserved for the function
		h.unchargeDevice(a.segSize)
	}
	return ResultSuccess
}

func (h *deviceHandler) CuMemFreeAsync(ctx context.Context, dptr, _ uint64) Result {
	return h.CuMemFree_v2(ctx, dptr)
}

func (h *deviceHandler) CuMemGetInfo_v2(context.Context) (uint64, uint64, Result) {
	total := h.info.Spec.MemoryBytes
	used := h.budgets.deviceBytes(h.info.Function) // every session of the function together
	return total - min(total, used), total, ResultSuccess
}

// chargeDevice charges n bytes of GPU memory to the function's quota, all its sessions together (a function does
// not get a quota per process), and reports whether they fit.
func (h *deviceHandler) chargeDevice(n uint64) bool {
	if !h.budgets.chargeDevice(h.info.Function, n, h.info.Spec.MemoryBytes) {
		return false
	}
	h.used += n
	return true
}

// unchargeDevice gives back n bytes the session charged.
func (h *deviceHandler) unchargeDevice(n uint64) {
	n = min(n, h.used)
	h.used -= n
	h.budgets.unchargeDevice(h.info.Function, n)
}

func (h *deviceHandler) CuMemGetAddressRange_v2(_ context.Context, dptr uint64) (uint64, uint64, Result) {
	i := h.findAllocation(dptr)
	if i < 0 {
		return 0, 0, ResultNotFound
	}
	return h.allocs[i].ptr, h.allocs[i].size, ResultSuccess
}

func (h *deviceHandler) addAllocation(a allocation) {
	i := sort.Search(len(h.allocs), func(i int) bool { return h.allocs[i].ptr >= a.ptr })
	h.allocs = append(h.allocs, allocation{})
	copy(h.allocs[i+1:], h.allocs[i:])
	h.allocs[i] = a
}

// findAllocation returns the index of the allocation containing p, or -1.
func (h *deviceHandler) findAllocation(p uint64) int {
	i := sort.Search(len(h.allocs), func(i int) bool { return h.allocs[i].ptr > p }) - 1
	if i >= 0 && p-h.allocs[i].ptr < h.allocs[i].size {
		return i
	}
	return -1
}

// owns reports whether [p, p+n) lies inside one of the session's own allocations: the isolation check of every
// copy and memset. Every call that names device memory by address must pass it before touching the
// device, with n computed without overflow (see memset), and answer h.refuse(...) otherwise; kernels are confined
// by the executors instead (one tenant's memory mapped on a GPU at a time).
func (h *deviceHandler) owns(p, n uint64) bool {
	i := h.findAllocation(p)
	return i >= 0 && n <= h.allocs[i].size-(p-h.allocs[i].ptr)
}

func (h *deviceHandler) refuse(call string, p, n uint64) Result {
	h.log.Warn("remoting: refused access outside the function's memory", "call", call, "ptr", fmt.Sprintf("%#x", p),
		"bytes", n)
	return ResultInvalidValue
}

const (
	ptrAttrMemoryType    = 2
	ptrAttrDevicePointer = 3
	ptrAttrSyncMemops    = 6
	ptrAttrBufferID      = 7
	ptrAttrIsManaged     = 8
	ptrAttrDeviceOrdinal = 9
	ptrAttrRangeStart    = 11
	ptrAttrRangeSize     = 12
	ptrAttrMapped        = 13
	memoryTypeDevice     = 2
)

func (h *deviceHandler) CuPointerGetAttribute(_ context.Context, data []byte, attr int32, ptr uint64) Result {
	i := h.findAllocation(ptr)
	if i < 0 {
		return ResultInvalidValue
	}
	a := h.allocs[i]
	var v uint64
	switch attr {
	case 1: // context: answered by the shim
	case ptrAttrMemoryType:
		v = memoryTypeDevice
	case ptrAttrDevicePointer:
		v = ptr
	case ptrAttrSyncMemops, ptrAttrMapped:
		v = 1
	case ptrAttrBufferID:
		v = a.ptr
	case ptrAttrIsManaged, ptrAttrDeviceOrdinal:
		v = 0
	case ptrAttrRangeStart:
		v = a.ptr
	case ptrAttrRangeSize:
		v = a.size
	default:
		return ResultNotSupported
	}
	binary.LittleEndian.PutUint64(data, v)
	return ResultSuccess
}

func (h *deviceHandler) CuMemGetAllocationGranularity(context.Context, []byte, uint32) (uint64, Result) {
	return h.node.ChunkSize(), ResultSuccess
}
