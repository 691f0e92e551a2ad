package cuda

import (
	"encoding/binary"
	"fmt"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/cuda/cu"
)

var (
	_ device.ConfigurableFunction = (*function)(nil)
	_ device.EnumerableModule     = (*module)(nil)
	_ device.ExtendedLauncher     = (*stream)(nil)
	_ device.TensorMapEncoder     = (*Backend)(nil)
)

// Attribute is cuFuncGetAttribute.
func (f *function) Attribute(a device.FuncAttr) (int32, error) {
	v, err := cu.FuncAttribute(f.mod.ctx, f.f, int(a))
	return v, wrap(err)
}

// SetAttribute is cuFuncSetAttribute.
func (f *function) SetAttribute(a device.FuncAttr, v int32) error {
	return wrap(cu.SetFuncAttribute(f.mod.ctx, f.f, int(a), v))
}

// FunctionNames lists the module's kernels (cuModuleEnumerateFunctions).
func (m *module) FunctionNames() []string {
	names, err := cu.ModuleFunctionNames(m.ctx, m.m)
	if err != nil {
		return nil
	}
	return names
}

// LaunchEx is cuLaunchKernelEx with the attributes as given; event attributes name this backend's events.
func (s *stream) LaunchEx(f device.Function, grid, block device.Dim3, sharedMem uint32, attrs []device.LaunchAttribute,
	args []byte) error {
	fn, ok := f.(*function)
	if !ok || fn.mod.b != s.b || fn.mod.gpu != s.gpu {
		return fmt.Errorf("%w: kernel not loaded on gpu %d", device.ErrInvalidValue, s.gpu)
	}
	if uint32(len(args)) < device.ArgsSize(fn.params) {
		return fmt.Errorf("%w: kernel %s needs %d argument bytes, got %d", device.ErrInvalidValue, fn.name,
			device.ArgsSize(fn.params), len(args))
	}
	raw := make([]byte, 72*len(attrs))
	for i, a := range attrs {
		r := raw[72*i:]
		binary.LittleEndian.PutUint32(r, a.ID)
		copy(r[8:72], a.Value[:])
		if a.Event != nil {
			ev, ok := a.Event.(*event)
			if !ok {
				return fmt.Errorf("%w: launch attribute %d: event of another backend", device.ErrInvalidValue, a.ID)
			}
			binary.LittleEndian.PutUint64(r[8:], uint64(uintptr(ev.e)))
		}
	}
	n := func(d device.Dim3) [3]uint32 { return [3]uint32{max(d.X, 1), max(d.Y, 1), max(d.Z, 1)} }
	if err := cu.LaunchEx(s.ctx, fn.f, n(grid), n(block), sharedMem, s.s, raw, args); err != nil {
		return wrap(err)
	}
	for _, a := range attrs {
		if ev, ok := a.Event.(*event); ok {
			ev.recorded.Store(true)
		}
	}
	return nil
}

// EncodeTensorMap runs the driver's cuTensorMapEncode* on GPU i.
func (b *Backend) EncodeTensorMap(i int, req device.TensorMapRequest) ([128]byte, error) {
	g, err := b.gpu(i)
	if err != nil {
		return [128]byte{}, err
	}
	m, err := cu.TensorMapEncode(g.ctx, cu.TensorMapArgs{Kind: req.Kind, DataType: req.DataType, Rank: req.Rank,
		Address: uint64(req.GlobalAddress), Dims: req.GlobalDim, Strides: req.GlobalStrides, Box: req.BoxDim,
		ElementStrides: req.ElementStride, Interleave: int32(req.Interleave), Swizzle: int32(req.Swizzle),
		L2: int32(req.L2Promotion), OOB: int32(req.OOBFill), Lower: req.PixelBoxLowerCorner,
		Upper: req.PixelBoxUpperCorner, Channels: req.ChannelsPerPixel, Pixels: req.PixelsPerColumn,
		Mode: int32(req.Mode)})
	return m, wrap(err)
}

// ReplaceTensorMapAddress is cuTensorMapReplaceAddress.
func (b *Backend) ReplaceTensorMapAddress(i int, m [128]byte, addr device.Ptr) ([128]byte, error) {
	g, err := b.gpu(i)
	if err != nil {
		return [128]byte{}, err
	}
	out, err := cu.TensorMapReplaceAddress(g.ctx, m, uint64(addr))
	return out, wrap(err)
}
