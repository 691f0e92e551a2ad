package remoting

import (
	"context"
	"encoding/binary"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
	"github.com/faas-gpu/faas-gpu/gpuserver/device/attrs"
)

// Functions and kernels: attributes (get, set, replayed on every GPU the kernel runs on), extended launches,
// enumeration and names.

// deviceFunction returns fn's kernel in the module loaded on the function's current GPU, with fn's attribute
// sets applied to it.
func (h *deviceHandler) deviceFunction(fn *function) (device.Function, Result) {
	l, err := h.loadOn(fn.mod, h.gpu)
	if err != nil {
		return nil, result(err)
	}
	df, err := l.Function(fn.name)
	if err != nil {
		return nil, result(err)
	}
	if len(fn.sets) > 0 && !fn.applied[h.gpu] {
		if cf, ok := df.(device.ConfigurableFunction); ok {
			for a, v := range fn.sets {
				if err := cf.SetAttribute(a, v); err != nil {
					h.log.Warn("remoting: replay a kernel attribute", "gpu", h.gpu, "kernel", fn.name,
						"attribute", int(a), "value", v, "err", err)
					return nil, result(err)
				}
			}
		}
		if fn.applied == nil {
			fn.applied = map[int]bool{}
		}
		fn.applied[h.gpu] = true
	}
	return df, ResultSuccess
}

func (h *deviceHandler) gpuInfo() device.GPUInfo {
	g := h.cfg.Device.GPUs()
	if h.gpu >= 0 && h.gpu < len(g) {
		return g[h.gpu]
	}
	return g[0]
}

// staticAttribute answers for a kernel whose backend knows only its static resources (the simulated device:
// from the cubin, zeros for PTX) or nothing: the rest are the driver's defaults on that GPU, and a settable
// attribute the function set is answered from its sets by the caller.
func staticAttribute(info device.GPUInfo, df device.Function, a device.FuncAttr) int32 {
	var st device.FunctionAttributes
	if af, ok := df.(device.AttributedFunction); ok {
		st = af.Attributes()
	}
	t := &info.Attributes
	switch a {
	case device.FuncMaxThreadsPerBlock:
		if st.MaxThreadsPerBlock > 0 {
			return int32(st.MaxThreadsPerBlock)
		}
		return t.Get(attrs.MaxThreadsPerBlock)
	case device.FuncSharedSizeBytes:
		return int32(st.SharedSizeBytes)
	case device.FuncLocalSizeBytes:
		return int32(st.LocalSizeBytes)
	case device.FuncNumRegs:
		return int32(st.NumRegs)
	case device.FuncPTXVersion, device.FuncBinaryVersion:
		if st.BinaryVersion > 0 {
			return int32(st.BinaryVersion)
		}
		return int32(info.ComputeCapability)
	case device.FuncMaxDynamicSharedSizeBytes:
		return t.Get(attrs.MaxSharedMemoryPerBlock) - int32(st.SharedSizeBytes)
	case device.FuncPreferredSharedMemoryCarveout:
		return -1
	}
	return 0 // const bytes, cache mode, cluster requirements: none
}

func (h *deviceHandler) funcAttribute(ctx context.Context, f uint64, a device.FuncAttr) (int32, Result) {
	fn, ok := h.funcs[f]
	if !ok {
		return 0, ResultInvalidHandle
	}
	if a < 0 || a >= device.FuncAttrCount {
		return 0, ResultInvalidValue
	}
	if _, r := h.bind(ctx); r != ResultSuccess {
		return 0, r
	}
	df, r := h.deviceFunction(fn)
	if r != ResultSuccess {
		return 0, r
	}
	if cf, ok := df.(device.ConfigurableFunction); ok {
		v, err := cf.Attribute(a)
		return v, result(err)
	}
	if v, ok := fn.sets[a]; ok {
		return v, ResultSuccess
	}
	return staticAttribute(h.gpuInfo(), df, a), ResultSuccess
}

func (h *deviceHandler) setFuncAttribute(ctx context.Context, f uint64, a device.FuncAttr, v int32) Result {
	fn, ok := h.funcs[f]
	if !ok {
		return ResultInvalidHandle
	}
	if !a.Settable() {
		return ResultInvalidValue
	}
	if a == device.FuncMaxDynamicSharedSizeBytes {
		static, r := h.funcAttribute(ctx, f, device.FuncSharedSizeBytes)
		if r != ResultSuccess {
			return r
		}
		info := h.gpuInfo()
		if v < 0 || v > info.Attributes.Get(attrs.MaxSharedMemoryPerBlockOptin)-static {
			return ResultInvalidValue
		}
	}
	if fn.sets == nil {
		fn.sets = map[device.FuncAttr]int32{}
	}
	fn.sets[a] = v
	fn.applied = nil // replayed on each GPU at its next use
	return ResultSuccess
}

func (h *deviceHandler) CuFuncGetAttribute(ctx context.Context, attrib int32, f uint64) (int32, Result) {
	return h.funcAttribute(ctx, f, device.FuncAttr(attrib))
}

func (h *deviceHandler) CuFuncSetAttribute(ctx context.Context, f uint64, attrib, value int32) Result {
	return h.setFuncAttribute(ctx, f, device.FuncAttr(attrib), value)
}

// CuKernelGetAttribute: a kernel is its own function here (one handle space); the shim sees one device.
func (h *deviceHandler) CuKernelGetAttribute(ctx context.Context, attrib int32, kernel uint64, dev int32) (int32, Result) {
	if dev != 0 {
		return 0, ResultInvalidDevice
	}
	return h.funcAttribute(ctx, kernel, device.FuncAttr(attrib))
}

func (h *deviceHandler) CuKernelSetAttribute(ctx context.Context, attrib, val int32, kernel uint64, dev int32) Result {
	if dev != 0 {
		return ResultInvalidDevice
	}
	return h.setFuncAttribute(ctx, kernel, device.FuncAttr(attrib), val)
}

// CuFuncSetCacheConfig records nothing: the L1/shared split is a preference the driver may ignore.
func (h *deviceHandler) CuFuncSetCacheConfig(_ context.Context, f uint64, config int32) Result {
	if _, ok := h.funcs[f]; !ok {
		return ResultInvalidHandle
	}
	if config < 0 || config > 3 {
		return ResultInvalidValue
	}
	return ResultSuccess
}

// launchAttrSize is the size of a CUlaunchAttribute: u32 id, 4 bytes of padding, a 64-byte value.
const launchAttrSize = 72

func (h *deviceHandler) CuLaunchKernelEx(ctx context.Context, f uint64, gx, gy, gz, bx, by, bz, shmem uint32, st uint64,
	raw []byte, _ uint64, args []byte, _ uint64) Result {
	if h.g.capturing(st) != nil {
		fn, ok := h.funcs[f]
		if !ok {
			return ResultInvalidHandle
		}
		at, a := append([]byte(nil), raw...), append([]byte(nil), args...) // the ring's bytes until the call returns
		r, _ := h.captured(st, graphNode{kind: "kernel", fn: f, bytes: len(at) + len(a), check: h.kernelCheck(fn, a),
			run: func(ctx context.Context, s uint64) Result {
				return h.CuLaunchKernelEx(ctx, f, gx, gy, gz, bx, by, bz, shmem, s, at, uint64(len(at)), a, uint64(len(a)))
			}})
		return r
	}
	if len(raw)%launchAttrSize != 0 || len(raw)/launchAttrSize > device.LaunchAttrMax*4 {
		return ResultInvalidValue
	}
	attrs := make([]device.LaunchAttribute, 0, len(raw)/launchAttrSize)
	for off := 0; off < len(raw); off += launchAttrSize {
		a := device.LaunchAttribute{ID: binary.LittleEndian.Uint32(raw[off:])}
		copy(a.Value[:], raw[off+8:off+launchAttrSize])
		if a.ID == device.LaunchAttrProgrammaticEvent || a.ID == device.LaunchAttrLaunchCompletionEvent {
			e, ok := h.events[binary.LittleEndian.Uint64(a.Value[:])]
			if !ok {
				return ResultInvalidHandle
			}
			if _, r := h.bind(ctx); r != ResultSuccess {
				return r
			}
			if r := h.eventOnGPU(e); r != ResultSuccess {
				return r
			}
			a.Event = e.ev
		}
		attrs = append(attrs, a)
	}
	return h.launch(ctx, f, device.Dim3{X: gx, Y: gy, Z: gz}, device.Dim3{X: bx, Y: by, Z: bz}, shmem, attrs, args)
}

// eventOnGPU makes e an event of the function's current GPU (recreated when the function moved).
func (h *deviceHandler) eventOnGPU(e *event) Result {
	dc, err := h.context(h.gpu)
	if err != nil {
		return result(err)
	}
	if e.gpu == h.gpu && e.ctx == dc {
		return ResultSuccess
	}
	ne, nctx, err := h.newEvent(h.gpu, e.timing)
	if err != nil {
		return result(err)
	}
	if e.ctx == nil || e.ctx.Err() == nil { // a context torn down by a fault took its events along
		_ = e.ev.Destroy()
	}
	e.ev, e.gpu, e.ctx = ne, h.gpu, nctx
	return ResultSuccess
}

func (h *deviceHandler) kernelNames(ctx context.Context, lib uint64) (*module, []string, Result) {
	m, ok := h.modules[lib]
	if !ok {
		return nil, nil, ResultInvalidHandle
	}
	if _, r := h.bind(ctx); r != ResultSuccess {
		return nil, nil, r
	}
	l, err := h.loadOn(m, h.gpu)
	if err != nil {
		return nil, nil, result(err)
	}
	em, ok := l.(device.EnumerableModule)
	if !ok {
		return nil, nil, ResultNotSupported
	}
	return m, em.FunctionNames(), ResultSuccess
}

func (h *deviceHandler) CuLibraryGetKernelCount(ctx context.Context, lib uint64) (uint32, Result) {
	_, names, r := h.kernelNames(ctx, lib)
	return uint32(len(names)), r
}

func (h *deviceHandler) CuLibraryEnumerateKernels(ctx context.Context, out []byte, n uint32, lib uint64) Result {
	_, names, r := h.kernelNames(ctx, lib)
	if r != ResultSuccess {
		return r
	}
	if int(n) > len(names) {
		return ResultInvalidValue
	}
	for i, name := range names[:n] {
		id, _, r := h.getFunction(ctx, lib, name)
		if r != ResultSuccess {
			return r
		}
		binary.LittleEndian.PutUint64(out[8*i:], id)
	}
	return ResultSuccess
}

func (h *deviceHandler) FuncGetName(_ context.Context, out []byte, f uint64) Result {
	fn, ok := h.funcs[f]
	if !ok {
		return ResultInvalidHandle
	}
	if len(fn.name)+1 > len(out) {
		return ResultInvalidValue
	}
	copy(out, fn.name)
	out[len(fn.name)] = 0
	return ResultSuccess
}

// --- tensor maps

// tensorMapRequestSize is the size of the shim's packed cuTensorMapEncode* arguments: u32 kind, data type, rank,
// interleave, swizzle, L2 promotion, OOB fill, im2col-wide mode; u64 global address; u64 dims[5], strides[4];
// u32 box[5], element strides[5]; i32 lower[3], upper[3]; u32 channels per pixel, pixels per column.
const tensorMapRequestSize = 184

func decodeTensorMapRequest(b []byte) device.TensorMapRequest {
	le := binary.LittleEndian
	u32 := func(off int) uint32 { return le.Uint32(b[off:]) }
	r := device.TensorMapRequest{Kind: int(u32(0)), DataType: u32(4), Rank: u32(8), Interleave: u32(12),
		Swizzle: u32(16), L2Promotion: u32(20), OOBFill: u32(24), Mode: u32(28),
		GlobalAddress: device.Ptr(le.Uint64(b[32:]))}
	for i := 0; i < 5; i++ {
		r.GlobalDim[i] = le.Uint64(b[40+8*i:])
		r.BoxDim[i] = u32(112 + 4*i)
		r.ElementStride[i] = u32(132 + 4*i)
	}
	for i := 0; i < 4; i++ {
		r.GlobalStrides[i] = le.Uint64(b[80+8*i:])
	}
	for i := 0; i < 3; i++ {
		r.PixelBoxLowerCorner[i] = int32(u32(152 + 4*i))
		r.PixelBoxUpperCorner[i] = int32(u32(164 + 4*i))
	}
	r.ChannelsPerPixel, r.PixelsPerColumn = u32(176), u32(180)
	return r
}

// tensorBits are the bits per element of each CUtensorMapDataType.
var tensorBits = [...]uint64{8, 16, 32, 32, 64, 64, 16, 32, 64, 16, 32, 32, 32, 4, 4, 6}

// tensorExtent is the bytes from the global address to the end of the tensor a map describes, or false when the
// request is malformed (the backend reports why).
func tensorExtent(r device.TensorMapRequest) (uint64, bool) {
	if r.Rank == 0 || r.Rank > 5 || int(r.DataType) >= len(tensorBits) {
		return 0, false
	}
	n := (r.GlobalDim[0]*tensorBits[r.DataType] + 7) / 8
	for i := uint32(1); i < r.Rank; i++ {
		if r.GlobalDim[i] == 0 || r.GlobalDim[i] > 1<<32 || r.GlobalStrides[i-1] >= 1<<40 {
			return 0, false
		}
		n += (r.GlobalDim[i] - 1) * r.GlobalStrides[i-1]
	}
	return n, r.GlobalDim[0] <= 1<<32
}

func (h *deviceHandler) TensorMapEncode(ctx context.Context, out []byte, req []byte, _ uint64) Result {
	if len(req) != tensorMapRequestSize {
		return ResultInvalidValue
	}
	r := decodeTensorMapRequest(req)
	if n, ok := tensorExtent(r); ok && !h.owns(uint64(r.GlobalAddress), n) {
		return h.refuse("cuTensorMapEncode", uint64(r.GlobalAddress), n)
	}
	enc, ok := h.cfg.Device.(device.TensorMapEncoder)
	if !ok {
		return ResultNotSupported
	}
	if _, res := h.bind(ctx); res != ResultSuccess {
		return res
	}
	m, err := enc.EncodeTensorMap(h.gpu, r)
	if err != nil {
		h.log.Debug("remoting: tensor map", "err", err)
		return result(err)
	}
	copy(out, m[:])
	return ResultSuccess
}

func (h *deviceHandler) TensorMapReplaceAddress(ctx context.Context, out, old []byte, addr uint64) Result {
	if !h.owns(addr, 1) {
		return h.refuse("cuTensorMapReplaceAddress", addr, 1)
	}
	enc, ok := h.cfg.Device.(device.TensorMapEncoder)
	if !ok {
		return ResultNotSupported
	}
	if _, res := h.bind(ctx); res != ResultSuccess {
		return res
	}
	var m [128]byte
	copy(m[:], old)
	m, err := enc.ReplaceTensorMapAddress(h.gpu, m, device.Ptr(addr))
	if err != nil {
		return result(err)
	}
	copy(out, m[:])
	return ResultSuccess
}
