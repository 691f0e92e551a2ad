package remoting

import (
	"context"
	"encoding/binary"
	"errors"

	"github.com/faas-gpu/faas-gpu/gpuserver/device"
)

// Kernel launches.

func (h *deviceHandler) CuLaunchKernel(ctx context.Context, f uint64, gx, gy, gz, bx, by, bz, shmem uint32, st uint64,
	args []byte, _ uint64) Result {
	if h.g.capturing(st) != nil {
		fn, ok := h.funcs[f]
		if !ok {
			return ResultInvalidHandle
		}
		a := append([]byte(nil), args...) // the record's bytes are the ring's until the call returns
		r, _ := h.captured(st, graphNode{kind: "kernel", fn: f, bytes: len(a), check: h.kernelCheck(fn, a),
			run: func(ctx context.Context, s uint64) Result {
				return h.CuLaunchKernel(ctx, f, gx, gy, gz, bx, by, bz, shmem, s, a, uint64(len(a)))
			}})
		return r
	}
	return h.launch(ctx, f, device.Dim3{X: gx, Y: gy, Z: gz}, device.Dim3{X: bx, Y: by, Z: bz}, shmem, nil, args)
}

// launch launches function f on the function's GPU: its attribute sets applied there first, pointers to module
// globals in its arguments translated to this GPU's copies; with attrs through cuLaunchKernelEx.
func (h *deviceHandler) launch(ctx context.Context, f uint64, grid, block device.Dim3, shmem uint32,
	attrs []device.LaunchAttribute, args []byte) Result {
	fn, ok := h.funcs[f]
	if !ok {
		return ResultInvalidHandle
	}
	s, r := h.bind(ctx)
	if r != ResultSuccess {
		return r
	}
	df, r := h.deviceFunction(fn)
	if r != ResultSuccess {
		return r
	}
	a := append([]byte(nil), args...)
	if len(h.globals) > 0 { // a pointer to a module global is the only argument translated per GPU
		for _, p := range df.Params() {
			if p.Size != 8 || int(p.Offset)+8 > len(a) {
				continue
			}
			v := binary.LittleEndian.Uint64(a[p.Offset:])
			if i := h.findAllocation(v); i >= 0 && h.allocs[i].global != nil {
				t, err := h.translate(v)
				if err != nil {
					return result(err)
				}
				binary.LittleEndian.PutUint64(a[p.Offset:], uint64(t))
			}
		}
	}
	var err error
	if attrs == nil {
		err = s.Launch(df, grid, block, shmem, a)
	} else {
		xl, ok := s.(device.ExtendedLauncher)
		if !ok {
			return ResultNotSupported
		}
		err = xl.LaunchEx(df, grid, block, shmem, attrs, a)
	}
	if errors.Is(err, device.ErrKernelNotSimulated) && h.budgets.firstNotSimulated(h.info.Function) {
		h.log.Warn("remoting: the simulated node cannot compute this function's kernels (it computes only its "+
			"reference kernels, not PyTorch's or cuBLAS's): its requests answer 501 until faas-gpu up (or the "+
			"gpuserver) runs with --sim-kernels=dry, which accepts every kernel without computing it (answers are "+
			"then meaningless), or on a GPU; logged once per function", "function", h.info.Function, "err", err)
	}
	return result(err)
}
