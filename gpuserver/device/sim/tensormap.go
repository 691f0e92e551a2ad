package sim

import (
	"encoding/binary"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/attrs"
)

var _ device.TensorMapEncoder = (*Backend)(nil)

// tensorMapMagic starts every tensor map the simulated driver encodes ("FGTM").
const tensorMapMagic = 0x4d544746

// EncodeTensorMap checks the arguments as cuTensorMapEncode* does and encodes them into the 128-byte descriptor
// in a format of the simulated device (a real GPU's format is the driver's secret; the simulated node never
// executes TMA instructions, so the descriptor only needs to be deterministic and to carry its arguments).
func (b *Backend) EncodeTensorMap(gpu int, r device.TensorMapRequest) ([128]byte, error) {
	var m [128]byte
	if err := b.validGPU(gpu); err != nil {
		return m, err
	}
	if b.gpus[gpu].Attributes.Get(attrs.TensorMapAccessSupported) == 0 {
		return m, fmt.Errorf("%w: tensor maps need compute capability 9.0 (gpu %d has %d)", device.ErrNotSupported,
			gpu, b.gpus[gpu].ComputeCapability)
	}
	if err := checkTensorMap(r); err != nil {
		return m, fmt.Errorf("%w: %w", device.ErrInvalidValue, err)
	}
	le := binary.LittleEndian
	le.PutUint32(m[0:], tensorMapMagic)
	m[4], m[5], m[6] = byte(r.Kind), byte(r.DataType), byte(r.Rank)
	m[7], m[8], m[9], m[10], m[11] = byte(r.Interleave), byte(r.Swizzle), byte(r.L2Promotion), byte(r.OOBFill),
		byte(r.Mode)
	le.PutUint64(m[16:], uint64(r.GlobalAddress))
	for i := 0; i < 5; i++ {
		le.PutUint64(m[24+8*i:], r.GlobalDim[i])
		le.PutUint16(m[96+2*i:], uint16(r.BoxDim[i]))
		m[106+i] = byte(r.ElementStride[i])
	}
	for i := 0; i < 4; i++ {
		le.PutUint64(m[64+8*i:], r.GlobalStrides[i])
	}
	for i := 0; i < 3; i++ {
		le.PutUint16(m[112+2*i:], uint16(int16(r.PixelBoxLowerCorner[i])))
		le.PutUint16(m[118+2*i:], uint16(int16(r.PixelBoxUpperCorner[i])))
	}
	le.PutUint16(m[124:], uint16(r.ChannelsPerPixel))
	le.PutUint16(m[126:], uint16(r.PixelsPerColumn))
	return m, nil
}

// ReplaceTensorMapAddress replaces the address of a descriptor EncodeTensorMap made.
func (b *Backend) ReplaceTensorMapAddress(gpu int, m [128]byte, addr device.Ptr) ([128]byte, error) {
	if err := b.validGPU(gpu); err != nil {
		return m, err
	}
	if binary.LittleEndian.Uint32(m[0:]) != tensorMapMagic {
		return m, fmt.Errorf("%w: not a tensor map of the simulated device", device.ErrInvalidValue)
	}
	align := uint64(16)
	if m[7] == 2 { // CU_TENSOR_MAP_INTERLEAVE_32B
		align = 32
	}
	if addr == 0 || uint64(addr)%align != 0 {
		return m, fmt.Errorf("%w: global address %#x not aligned to %d bytes", device.ErrInvalidValue, addr, align)
	}
	binary.LittleEndian.PutUint64(m[16:], uint64(addr))
	return m, nil
}

// checkTensorMap applies the driver's documented limits of cuTensorMapEncodeTiled, Im2col and Im2colWide.
func checkTensorMap(r device.TensorMapRequest) error {
	minRank := uint32(1)
	if r.Kind != device.TensorMapTiled {
		minRank = 3
	}
	switch {
	case r.Kind < device.TensorMapTiled || r.Kind > device.TensorMapIm2colWide:
		return fmt.Errorf("tensor map kind %d", r.Kind)
	case r.DataType > 15:
		return fmt.Errorf("data type %d", r.DataType)
	case r.Rank < minRank || r.Rank > 5:
		return fmt.Errorf("rank %d (%d..5)", r.Rank, minRank)
	case r.Interleave > 2:
		return fmt.Errorf("interleave %d", r.Interleave)
	case r.Swizzle > 7:
		return fmt.Errorf("swizzle %d", r.Swizzle)
	case r.L2Promotion > 3:
		return fmt.Errorf("L2 promotion %d", r.L2Promotion)
	case r.OOBFill > 1:
		return fmt.Errorf("out-of-bounds fill %d", r.OOBFill)
	case r.Mode > 1:
		return fmt.Errorf("im2col wide mode %d", r.Mode)
	}
	align := uint64(16)
	if r.Interleave == 2 {
		align = 32
	}
	if r.GlobalAddress == 0 || uint64(r.GlobalAddress)%align != 0 {
		return fmt.Errorf("global address %#x not aligned to %d bytes", r.GlobalAddress, align)
	}
	for i := uint32(0); i < r.Rank; i++ {
		if r.GlobalDim[i] == 0 || r.GlobalDim[i] > 1<<32 {
			return fmt.Errorf("global dimension %d is %d (1..2^32)", i, r.GlobalDim[i])
		}
		if r.ElementStride[i] == 0 || r.ElementStride[i] > 8 {
			return fmt.Errorf("element stride %d is %d (1..8)", i, r.ElementStride[i])
		}
		if r.Kind == device.TensorMapTiled && (r.BoxDim[i] == 0 || r.BoxDim[i] > 256) {
			return fmt.Errorf("box dimension %d is %d (1..256)", i, r.BoxDim[i])
		}
		if i > 0 && (r.GlobalStrides[i-1]%align != 0 || r.GlobalStrides[i-1] >= 1<<40) {
			return fmt.Errorf("global stride %d is %d (a multiple of %d below 2^40)", i-1, r.GlobalStrides[i-1],
				align)
		}
	}
	if r.Kind != device.TensorMapTiled && (r.ChannelsPerPixel == 0 || r.ChannelsPerPixel > 256 ||
		r.PixelsPerColumn == 0 || r.PixelsPerColumn > 1024) {
		return fmt.Errorf("im2col channels per pixel %d (1..256), pixels per column %d (1..1024)",
			r.ChannelsPerPixel, r.PixelsPerColumn)
	}
	return nil
}
