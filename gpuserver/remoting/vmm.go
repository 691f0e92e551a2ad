package remoting

import (
	"context"
	"encoding/binary"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Virtual memory management (PyTorch's expandable segments) mapped onto the function's fixed addresses: a
// reservation is a range of the function's address space (executor.Node.ReserveRange); a physical allocation
// (cuMemCreate) is counted against the function's quota and becomes memory where it is mapped: cuMemMap places a
// block at that address (Node.AllocAt), backed on whichever GPU the function runs on and swapped with it like any
// other; cuMemUnmap frees the block, and the address may be mapped again. Granularity is the node's chunk size.

type vmmHandle struct {
	size   uint64
	mapped int // mappings of it (it stays counted until released)
}

type vmmMapping struct {
	size   uint64
	handle uint64
}

// CUmemAllocationProp and CUmemAccessDesc fields (cuda.h).
const (
	memAllocationTypePinned = 1
	memLocationTypeDevice   = 1
	memAccessRead           = 1
	memAccessReadWrite      = 3
)

func (h *deviceHandler) vmmState() {
	if h.vmmRanges == nil {
		h.vmmRanges = map[uint64]uint64{}
		h.vmmHandles = map[uint64]*vmmHandle{}
		h.vmmMappings = map[uint64]*vmmMapping{}
	}
}

func (h *deviceHandler) CuMemAddressReserve(_ context.Context, size, alignment, _, flags uint64) (uint64, Result) {
	h.vmmState()
	gran := h.node.ChunkSize()
	if size == 0 || size%gran != 0 || flags != 0 || alignment%gran != 0 && alignment > gran {
		return 0, ResultInvalidValue
	}
	p, err := h.node.ReserveRange(h.info.Function, size, alignment)
	if err != nil {
		return 0, result(err)
	}
	h.vmmRanges[uint64(p)] = size
	return uint64(p), ResultSuccess
}

func (h *deviceHandler) CuMemAddressFree(_ context.Context, ptr, size uint64) Result {
	h.vmmState()
	if s, ok := h.vmmRanges[ptr]; !ok || s != size {
		return ResultInvalidValue
	}
	if err := h.node.FreeRange(h.info.Function, device.Ptr(ptr)); err != nil {
		return result(err)
	}
	delete(h.vmmRanges, ptr)
	return ResultSuccess
}

// CuMemCreate accepts pinned device memory of the function's device (location 0), a multiple of the granularity.
func (h *deviceHandler) CuMemCreate(_ context.Context, size uint64, prop []byte, flags uint64) (uint64, Result) {
	h.vmmState()
	le := binary.LittleEndian
	typ, locType, locID := le.Uint32(prop[0:]), le.Uint32(prop[8:]), int32(le.Uint32(prop[12:]))
	if typ != memAllocationTypePinned || locType != memLocationTypeDevice || flags != 0 {
		return 0, ResultNotSupported
	}
	if locID != 0 {
		return 0, ResultInvalidDevice
	}
	if size == 0 || size%h.node.ChunkSize() != 0 {
		return 0, ResultInvalidValue
	}
	if !h.chargeDevice(size) {
		return 0, ResultOutOfMemory
	}
	id := h.handle()
	h.vmmHandles[id] = &vmmHandle{size: size}
	return id, ResultSuccess
}

func (h *deviceHandler) CuMemRelease(_ context.Context, handle uint64) Result {
	h.vmmState()
	ph, ok := h.vmmHandles[handle]
	if !ok {
		return ResultInvalidHandle
	}
	delete(h.vmmHandles, handle)
	h.unchargeDevice(ph.size)
	return ResultSuccess
}

// CuMemMap maps a whole physical allocation (offset 0, as the driver requires) at ptr inside a reservation.
func (h *deviceHandler) CuMemMap(ctx context.Context, ptr, size, offset, handle, flags uint64) Result {
	h.vmmState()
	ph, ok := h.vmmHandles[handle]
	if !ok {
		return ResultInvalidHandle
	}
	if offset != 0 || size != ph.size || flags != 0 {
		return ResultInvalidValue
	}
	if _, r := h.bind(ctx); r != ResultSuccess {
		return r
	}
	if _, err := h.node.AllocAt(ctx, h.info.Function, device.Ptr(ptr), size, h.phase()); err != nil {
		return result(err)
	}
	ph.mapped++
	h.vmmMappings[ptr] = &vmmMapping{size: size, handle: handle}
	h.addAllocation(allocation{ptr: ptr, size: size, ownSegment: true, mapped: true})
	return ResultSuccess
}

// CuMemSetAccess accepts read or read-write access for the function's device: a mapping is accessible there.
func (h *deviceHandler) CuMemSetAccess(_ context.Context, ptr, size uint64, desc []byte, count uint64) Result {
	h.vmmState()
	if count == 0 || !h.owns(ptr, size) {
		return ResultInvalidValue
	}
	for i := uint64(0); i < count; i++ {
		d := desc[12*i:]
		typ, id, flags := binary.LittleEndian.Uint32(d), int32(binary.LittleEndian.Uint32(d[4:])),
			binary.LittleEndian.Uint32(d[8:])
		if typ != memLocationTypeDevice {
			return ResultNotSupported
		}
		if id != 0 {
			return ResultInvalidDevice
		}
		if flags != memAccessRead && flags != memAccessReadWrite {
			return ResultInvalidValue
		}
	}
	return ResultSuccess
}

// CuMemUnmap frees the blocks of the mappings in [ptr, ptr+size), which must cover whole mappings.
func (h *deviceHandler) CuMemUnmap(ctx context.Context, ptr, size uint64) Result {
	h.vmmState()
	var in []uint64
	for p, m := range h.vmmMappings {
		if p >= ptr && p-ptr < size {
			if m.size > size-(p-ptr) {
				return ResultInvalidValue
			}
			in = append(in, p)
		}
	}
	if len(in) == 0 {
		return ResultInvalidValue
	}
	if r := h.syncStream(ctx); r != ResultSuccess {
		return r
	}
	for _, p := range in {
		if err := h.node.Free(h.info.Function, device.Ptr(p)); err != nil {
			return result(err)
		}
		if i := h.findAllocation(p); i >= 0 && h.allocs[i].ptr == p {
			h.allocs = append(h.allocs[:i], h.allocs[i+1:]...)
		}
		if ph, ok := h.vmmHandles[h.vmmMappings[p].handle]; ok {
			ph.mapped--
		}
		delete(h.vmmMappings, p)
	}
	return ResultSuccess
}
