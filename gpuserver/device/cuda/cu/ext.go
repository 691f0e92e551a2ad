package cu

/*
#include <stdlib.h>
#include <string.h>
#include "cu.h"
*/
import "C"

import (
	"strings"
	"unsafe"
)

// FuncAttribute returns attribute a of function f (cuFuncGetAttribute).
func FuncAttribute(ctx Context, f Function, a int) (int32, error) {
	var v C.int
	err := check("cuFuncGetAttribute", C.fg_func_attr(C.CUcontext(ctx), C.CUfunction(f), C.int(a), &v))
	return int32(v), err
}

// SetFuncAttribute sets attribute a of function f (cuFuncSetAttribute).
func SetFuncAttribute(ctx Context, f Function, a int, v int32) error {
	return check("cuFuncSetAttribute", C.fg_func_set_attr(C.CUcontext(ctx), C.CUfunction(f), C.int(a), C.int(v)))
}

// ModuleFunctionNames lists the names of a module's functions (cuModuleEnumerateFunctions, cuFuncGetName).
func ModuleFunctionNames(ctx Context, m Module) ([]string, error) {
	var n C.uint
	if err := check("cuModuleGetFunctionCount", C.fg_module_count(C.CUcontext(ctx), C.CUmodule(m), &n)); err != nil {
		return nil, err
	}
	const capacity = 64 << 20
	buf := C.malloc(capacity)
	defer C.free(buf)
	var used C.size_t
	err := check("cuModuleEnumerateFunctions", C.fg_module_names(C.CUcontext(ctx), C.CUmodule(m), n, (*C.char)(buf),
		capacity, &used))
	if err != nil {
		return nil, err
	}
	s := C.GoStringN((*C.char)(buf), C.int(used))
	return strings.Split(strings.TrimSuffix(s, "\x00"), "\x00"), nil
}

// LaunchEx launches a kernel with launch attributes (raw CUlaunchAttribute records, 72 bytes each).
func LaunchEx(ctx Context, f Function, grid, block [3]uint32, shared uint32, s Stream, attrs []byte,
	args []byte) error {
	var pa, pg unsafe.Pointer
	if len(attrs) > 0 {
		pa = unsafe.Pointer(&attrs[0])
	}
	if len(args) > 0 {
		pg = unsafe.Pointer(&args[0])
	}
	return check("cuLaunchKernelEx", C.fg_launch_ex(C.CUcontext(ctx), C.CUfunction(f), C.uint(grid[0]),
		C.uint(grid[1]), C.uint(grid[2]), C.uint(block[0]), C.uint(block[1]), C.uint(block[2]), C.uint(shared),
		C.CUstream(s), pa, C.uint(len(attrs)/72), pg, C.size_t(len(args))))
}

// TensorMapArgs are the arguments of the cuTensorMapEncode* calls.
type TensorMapArgs struct {
	Kind                         int
	DataType, Rank               uint32
	Address                      uint64
	Dims                         [5]uint64
	Strides                      [4]uint64
	Box, ElementStrides          [5]uint32
	Interleave, Swizzle, L2, OOB int32
	Lower, Upper                 [3]int32
	Channels, Pixels             uint32
	Mode                         int32
}

// TensorMapEncode encodes a 128-byte tensor map.
func TensorMapEncode(ctx Context, a TensorMapArgs) ([128]byte, error) {
	out := C.aligned_alloc(64, 128)
	defer C.free(out)
	var dims [5]C.ulonglong
	var strides [4]C.ulonglong
	var box, es [5]C.uint
	var lower, upper [3]C.int
	for i := range dims {
		dims[i], box[i], es[i] = C.ulonglong(a.Dims[i]), C.uint(a.Box[i]), C.uint(a.ElementStrides[i])
	}
	for i := range strides {
		strides[i] = C.ulonglong(a.Strides[i])
	}
	for i := range lower {
		lower[i], upper[i] = C.int(a.Lower[i]), C.int(a.Upper[i])
	}
	err := check("cuTensorMapEncode", C.fg_tensor_map(C.CUcontext(ctx), C.int(a.Kind), out, C.int(a.DataType),
		C.uint(a.Rank), C.CUdeviceptr(a.Address), &dims[0], &strides[0], &box[0], &es[0],
		C.int(a.Interleave), C.int(a.Swizzle), C.int(a.L2), C.int(a.OOB), &lower[0], &upper[0], C.uint(a.Channels),
		C.uint(a.Pixels), C.int(a.Mode)))
	var m [128]byte
	copy(m[:], C.GoBytes(out, 128))
	return m, err
}

// TensorMapReplaceAddress replaces the global address of a tensor map.
func TensorMapReplaceAddress(ctx Context, m [128]byte, addr uint64) ([128]byte, error) {
	buf := C.aligned_alloc(64, 128)
	defer C.free(buf)
	C.memcpy(buf, unsafe.Pointer(&m[0]), 128)
	err := check("cuTensorMapReplaceAddress", C.fg_tensor_map_replace(C.CUcontext(ctx), buf,
		C.CUdeviceptr(addr)))
	var out [128]byte
	copy(out[:], C.GoBytes(buf, 128))
	return out, err
}

// GraphExec is an instantiated CUDA graph.
type GraphExec unsafe.Pointer

// CaptureBegin starts capturing stream s in relaxed mode (cuStreamBeginCapture_v2).
func CaptureBegin(ctx Context, s Stream) error {
	return check("cuStreamBeginCapture", C.fg_capture_begin(C.CUcontext(ctx), C.CUstream(s)))
}

// CaptureEnd ends the capture of s and instantiates the graph (cuStreamEndCapture, cuGraphInstantiateWithFlags).
func CaptureEnd(ctx Context, s Stream) (GraphExec, error) {
	var exec unsafe.Pointer
	err := check("cuStreamEndCapture", C.fg_capture_end(C.CUcontext(ctx), C.CUstream(s), &exec))
	return GraphExec(exec), err
}

// GraphLaunch launches an instantiated graph on s (cuGraphLaunch).
func GraphLaunch(ctx Context, g GraphExec, s Stream) error {
	return check("cuGraphLaunch", C.fg_graph_launch(C.CUcontext(ctx), unsafe.Pointer(g), C.CUstream(s)))
}

// GraphExecDestroy destroys an instantiated graph (cuGraphExecDestroy).
func GraphExecDestroy(ctx Context, g GraphExec) error {
	return check("cuGraphExecDestroy", C.fg_graph_exec_destroy(C.CUcontext(ctx), unsafe.Pointer(g)))
}
