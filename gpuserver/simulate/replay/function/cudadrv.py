"""A minimal CUDA driver API binding with ctypes (standard library only).

libcuda.so.1 is faas-gpu's shim in a function process: every call below is forwarded to the gpuserver, which runs
it on the GPU bound to the current request (or, during initialisation, an implicitly bound one).
"""

import ctypes

_u64 = ctypes.c_uint64
_vp = ctypes.c_void_p


class CudaError(Exception):
    """A CUDA driver call failed."""

    def __init__(self, call, code, name):
        super().__init__(f"{call}: {name} ({code})")
        self.call = call
        self.code = code


class Driver:
    """The device, its primary context, and the calls a function needs."""

    def __init__(self, lib="libcuda.so.1"):
        self.lib = ctypes.CDLL(lib)
        L = self.lib
        L.cuMemAlloc_v2.argtypes = [ctypes.POINTER(_u64), ctypes.c_size_t]
        L.cuMemFree_v2.argtypes = [_u64]
        L.cuMemcpyHtoD_v2.argtypes = [_u64, _vp, ctypes.c_size_t]
        L.cuMemcpyDtoH_v2.argtypes = [_vp, _u64, ctypes.c_size_t]
        L.cuModuleLoadData.argtypes = [ctypes.POINTER(_vp), ctypes.c_char_p]
        L.cuModuleGetFunction.argtypes = [ctypes.POINTER(_vp), _vp, ctypes.c_char_p]
        L.cuLaunchKernel.argtypes = [_vp] + [ctypes.c_uint] * 7 + [_vp, ctypes.POINTER(_vp), ctypes.POINTER(_vp)]
        L.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.check("cuInit", L.cuInit(0))
        dev = ctypes.c_int()
        self.check("cuDeviceGet", L.cuDeviceGet(ctypes.byref(dev), 0))
        ctx = _vp()
        self.check("cuDevicePrimaryCtxRetain", L.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        self.check("cuCtxSetCurrent", L.cuCtxSetCurrent(ctx))

    def check(self, call, code):
        if code != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(code, ctypes.byref(name))
            raise CudaError(call, code, (name.value or b"unknown").decode())

    def alloc(self, size):
        p = _u64()
        self.check("cuMemAlloc", self.lib.cuMemAlloc_v2(ctypes.byref(p), size))
        return p.value

    def free(self, ptr):
        self.check("cuMemFree", self.lib.cuMemFree_v2(ptr))

    def htod(self, ptr, data):
        """Copies bytes-like data (bytes, bytearray, array) to device address ptr."""
        buf = (ctypes.c_char * len(memoryview(data).cast("B"))).from_buffer_copy(data)
        self.check("cuMemcpyHtoD", self.lib.cuMemcpyHtoD_v2(ptr, buf, len(buf)))

    def dtoh(self, ptr, size):
        buf = ctypes.create_string_buffer(size)
        self.check("cuMemcpyDtoH", self.lib.cuMemcpyDtoH_v2(buf, ptr, size))
        return buf.raw

    def load_module(self, image):
        mod = _vp()
        self.check("cuModuleLoadData", self.lib.cuModuleLoadData(ctypes.byref(mod), image))
        return mod

    def function(self, module, name):
        f = _vp()
        self.check("cuModuleGetFunction", self.lib.cuModuleGetFunction(ctypes.byref(f), module, name.encode()))
        return f

    def launch(self, f, grid, block, *args):
        """Launches f; args are ctypes values (c_uint64 for pointers, c_uint, c_float) in parameter order."""
        params = (_vp * len(args))(*[ctypes.cast(ctypes.pointer(a), _vp) for a in args])
        g = tuple(grid) + (1,) * (3 - len(grid))
        b = tuple(block) + (1,) * (3 - len(block))
        self.check("cuLaunchKernel", self.lib.cuLaunchKernel(f, *g, *b, 0, None, params, None))

    def synchronize(self):
        self.check("cuCtxSynchronize", self.lib.cuCtxSynchronize())
