// Thin wrappers over the CUDA driver API, loaded with dlopen at run time. Every entry point sets the GPU's
// context current on the calling thread and makes the driver call within the same C call, so no Go code runs
// between the two (the thread cannot change under it). No CUDA header is needed: the few types are declared here.
#include <dlfcn.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "cu.h"

static struct {
	void *h;
	CUresult (*cuInit)(unsigned);
	CUresult (*cuGetErrorString)(CUresult, const char **);
	CUresult (*cuDeviceGetCount)(int *);
	CUresult (*cuDeviceGet)(CUdevice *, int);
	CUresult (*cuDeviceGetName)(char *, int, CUdevice);
	CUresult (*cuDeviceTotalMem)(size_t *, CUdevice);
	CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
	CUresult (*cuDeviceGetPCIBusId)(char *, int, CUdevice);
	CUresult (*cuDeviceGetUuid)(unsigned char *, CUdevice);
	CUresult (*cuDeviceCanAccessPeer)(int *, CUdevice, CUdevice);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
	CUresult (*cuCtxSetCurrent)(CUcontext);
	CUresult (*cuMemGetInfo)(size_t *, size_t *);
	CUresult (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
	CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
	CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
	CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
	CUresult (*cuMemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
	CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, int);
	CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
	CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*cuMemHostRegister)(void *, size_t, unsigned);
	CUresult (*cuMemHostUnregister)(void *);
	CUresult (*cuStreamCreate)(CUstream *, unsigned);
	CUresult (*cuStreamDestroy)(CUstream);
	CUresult (*cuStreamSynchronize)(CUstream);
	CUresult (*cuStreamQuery)(CUstream);
	CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
	CUresult (*cuEventCreate)(CUevent *, unsigned);
	CUresult (*cuEventRecord)(CUevent, CUstream);
	CUresult (*cuEventQuery)(CUevent);
	CUresult (*cuEventSynchronize)(CUevent);
	CUresult (*cuEventDestroy)(CUevent);
	CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
	CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
	CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned, size_t, CUstream);
	CUresult (*cuModuleLoadData)(CUmodule *, const void *);
	CUresult (*cuModuleUnload)(CUmodule);
	CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*cuModuleGetGlobal)(CUdeviceptr *, size_t *, CUmodule, const char *);
	CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
	                           CUstream, void **, void **);
	CUresult (*cuFuncGetParamInfo)(CUfunction, size_t, size_t *, size_t *); // CUDA >= 12.4, optional
	// optional: function attributes, enumeration, extended launches, tensor maps
	CUresult (*cuFuncGetAttribute)(int *, int, CUfunction);
	CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
	CUresult (*cuFuncGetName)(const char **, CUfunction);
	CUresult (*cuModuleGetFunctionCount)(unsigned *, CUmodule);
	CUresult (*cuModuleEnumerateFunctions)(CUfunction *, unsigned, CUmodule);
	CUresult (*cuLaunchKernelEx)(const void *, CUfunction, void **, void **);
	CUresult (*cuTensorMapEncodeTiled)(void *, int, unsigned, void *, const unsigned long long *,
	                                   const unsigned long long *, const unsigned *, const unsigned *, int, int, int,
	                                   int);
	CUresult (*cuTensorMapEncodeIm2col)(void *, int, unsigned, void *, const unsigned long long *,
	                                    const unsigned long long *, const int *, const int *, unsigned, unsigned,
	                                    const unsigned *, int, int, int, int);
	CUresult (*cuTensorMapEncodeIm2colWide)(void *, int, unsigned, void *, const unsigned long long *,
	                                        const unsigned long long *, int, int, unsigned, unsigned,
	                                        const unsigned *, int, int, int, int, int);
	CUresult (*cuTensorMapReplaceAddress)(void *, void *);
	// optional: stream capture and graphs
	CUresult (*cuStreamBeginCapture)(CUstream, int);
	CUresult (*cuStreamEndCapture)(CUstream, void **);
	CUresult (*cuGraphInstantiateWithFlags)(void **, void *, unsigned long long);
	CUresult (*cuGraphLaunch)(void *, CUstream);
	CUresult (*cuGraphDestroy)(void *);
	CUresult (*cuGraphExecDestroy)(void *);
} d;

#define SYM(field, name)                                                                        \
	do {                                                                                    \
		*(void **)(&d.field) = dlsym(d.h, name);                                        \
		if (!d.field) {                                                                 \
			snprintf(err, errlen, "libcuda: missing symbol %s", name);              \
			return -1;                                                              \
		}                                                                               \
	} while (0)

int fg_load(const char *path, char *err, int errlen) {
	if (d.h) return 0;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return -1;
	}
	d.h = h;
	SYM(cuInit, "cuInit");
	SYM(cuGetErrorString, "cuGetErrorString");
	SYM(cuDeviceGetCount, "cuDeviceGetCount");
	SYM(cuDeviceGet, "cuDeviceGet");
	SYM(cuDeviceGetName, "cuDeviceGetName");
	SYM(cuDeviceTotalMem, "cuDeviceTotalMem_v2");
	SYM(cuDeviceGetAttribute, "cuDeviceGetAttribute");
	SYM(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId");
	SYM(cuDeviceGetUuid, "cuDeviceGetUuid");
	SYM(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer");
	SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
	SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
	SYM(cuMemGetInfo, "cuMemGetInfo_v2");
	SYM(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
	SYM(cuMemAddressReserve, "cuMemAddressReserve");
	SYM(cuMemAddressFree, "cuMemAddressFree");
	SYM(cuMemCreate, "cuMemCreate");
	SYM(cuMemRelease, "cuMemRelease");
	SYM(cuMemMap, "cuMemMap");
	SYM(cuMemUnmap, "cuMemUnmap");
	SYM(cuMemSetAccess, "cuMemSetAccess");
	SYM(cuMemHostRegister, "cuMemHostRegister_v2");
	SYM(cuMemHostUnregister, "cuMemHostUnregister");
	SYM(cuStreamCreate, "cuStreamCreate");
	SYM(cuStreamDestroy, "cuStreamDestroy_v2");
	SYM(cuStreamSynchronize, "cuStreamSynchronize");
	SYM(cuStreamQuery, "cuStreamQuery");
	SYM(cuStreamWaitEvent, "cuStreamWaitEvent");
	SYM(cuEventCreate, "cuEventCreate");
	SYM(cuEventRecord, "cuEventRecord");
	SYM(cuEventQuery, "cuEventQuery");
	SYM(cuEventSynchronize, "cuEventSynchronize");
	SYM(cuEventDestroy, "cuEventDestroy_v2");
	SYM(cuEventElapsedTime, "cuEventElapsedTime");
	SYM(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
	SYM(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
	SYM(cuMemcpyAsync, "cuMemcpyAsync");
	SYM(cuMemsetD8Async, "cuMemsetD8Async");
	SYM(cuMemsetD32Async, "cuMemsetD32Async");
	SYM(cuModuleLoadData, "cuModuleLoadData");
	SYM(cuModuleUnload, "cuModuleUnload");
	SYM(cuModuleGetFunction, "cuModuleGetFunction");
	SYM(cuModuleGetGlobal, "cuModuleGetGlobal_v2");
	SYM(cuLaunchKernel, "cuLaunchKernel");
	*(void **)(&d.cuFuncGetParamInfo) = dlsym(d.h, "cuFuncGetParamInfo");
	*(void **)(&d.cuFuncGetAttribute) = dlsym(d.h, "cuFuncGetAttribute");
	*(void **)(&d.cuFuncSetAttribute) = dlsym(d.h, "cuFuncSetAttribute");
	*(void **)(&d.cuFuncGetName) = dlsym(d.h, "cuFuncGetName");
	*(void **)(&d.cuModuleGetFunctionCount) = dlsym(d.h, "cuModuleGetFunctionCount");
	*(void **)(&d.cuModuleEnumerateFunctions) = dlsym(d.h, "cuModuleEnumerateFunctions");
	*(void **)(&d.cuLaunchKernelEx) = dlsym(d.h, "cuLaunchKernelEx");
	*(void **)(&d.cuTensorMapEncodeTiled) = dlsym(d.h, "cuTensorMapEncodeTiled");
	*(void **)(&d.cuTensorMapEncodeIm2col) = dlsym(d.h, "cuTensorMapEncodeIm2col");
	*(void **)(&d.cuTensorMapEncodeIm2colWide) = dlsym(d.h, "cuTensorMapEncodeIm2colWide");
	*(void **)(&d.cuTensorMapReplaceAddress) = dlsym(d.h, "cuTensorMapReplaceAddress");
	*(void **)(&d.cuMemExportToShareableHandle) = dlsym(d.h, "cuMemExportToShareableHandle");
	*(void **)(&d.cuMemImportFromShareableHandle) = dlsym(d.h, "cuMemImportFromShareableHandle");
	*(void **)(&d.cuStreamBeginCapture) = dlsym(d.h, "cuStreamBeginCapture_v2");
	*(void **)(&d.cuStreamEndCapture) = dlsym(d.h, "cuStreamEndCapture");
	*(void **)(&d.cuGraphInstantiateWithFlags) = dlsym(d.h, "cuGraphInstantiateWithFlags");
	*(void **)(&d.cuGraphLaunch) = dlsym(d.h, "cuGraphLaunch");
	*(void **)(&d.cuGraphDestroy) = dlsym(d.h, "cuGraphDestroy");
	*(void **)(&d.cuGraphExecDestroy) = dlsym(d.h, "cuGraphExecDestroy");
	return 0;
}

const char *fg_error_string(CUresult r) {
	const char *s = NULL;
	if (d.cuGetErrorString && d.cuGetErrorString(r, &s) == 0 && s) return s;
	return "unknown CUDA error";
}

CUresult fg_init(void) { return d.cuInit(0); }
CUresult fg_device_count(int *n) { return d.cuDeviceGetCount(n); }

CUresult fg_device_open(int ordinal, CUdevice *dev, CUcontext *ctx) {
	CUresult r = d.cuDeviceGet(dev, ordinal);
	if (r) return r;
	return d.cuDevicePrimaryCtxRetain(ctx, *dev);
}

CUresult fg_device_close(CUdevice dev) { return d.cuDevicePrimaryCtxRelease(dev); }

CUresult fg_device_info(CUcontext ctx, CUdevice dev, char *name, int namelen, char *bus, int buslen, size_t *total,
                        int *major, int *minor, size_t *gran) {
	CUresult r;
	if ((r = d.cuCtxSetCurrent(ctx))) return r;
	if ((r = d.cuDeviceGetName(name, namelen, dev))) return r;
	if ((r = d.cuDeviceGetPCIBusId(bus, buslen, dev))) return r;
	if ((r = d.cuDeviceTotalMem(total, dev))) return r;
	if ((r = d.cuDeviceGetAttribute(major, 75, dev))) return r; // COMPUTE_CAPABILITY_MAJOR
	if ((r = d.cuDeviceGetAttribute(minor, 76, dev))) return r; // COMPUTE_CAPABILITY_MINOR
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof prop);
	prop.type = 1;          // CU_MEM_ALLOCATION_TYPE_PINNED
	prop.location.type = 1; // CU_MEM_LOCATION_TYPE_DEVICE
	prop.location.id = dev;
	return d.cuMemGetAllocationGranularity(gran, &prop, 0); // MINIMUM
}

CUresult fg_device_uuid(CUdevice dev, unsigned char *uuid) { return d.cuDeviceGetUuid(uuid, dev); }

// fg_device_attrs reads attributes 1..n-1 into vals; one the driver does not know (an older driver) reads 0.
CUresult fg_device_attrs(CUdevice dev, int *vals, int n) {
	vals[0] = 0;
	for (int a = 1; a < n; a++) {
		CUresult r = d.cuDeviceGetAttribute(&vals[a], a, dev);
		if (r == 1) { // CUDA_ERROR_INVALID_VALUE
			vals[a] = 0;
		} else if (r) {
			return r;
		}
	}
	return 0;
}

CUresult fg_can_access_peer(int *can, CUdevice a, CUdevice b) { return d.cuDeviceCanAccessPeer(can, a, b); }

CUresult fg_mem_info(CUcontext ctx, size_t *free, size_t *total) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemGetInfo(free, total);
}

CUresult fg_reserve(CUcontext ctx, CUdeviceptr *p, size_t size, size_t align) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemAddressReserve(p, size, align, 0, 0);
}

CUresult fg_reserve_at(CUcontext ctx, CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemAddressReserve(p, size, align, addr, 0);
}

CUresult fg_address_free(CUcontext ctx, CUdeviceptr p, size_t size) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemAddressFree(p, size);
}

CUresult fg_create(CUcontext ctx, int dev, size_t size, CUmemGenericAllocationHandle *h) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	if (r) return r;
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof prop);
	prop.type = 1;
	prop.location.type = 1;
	prop.location.id = dev;
	return d.cuMemCreate(h, size, &prop, 0);
}

// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: physical memory another process can import (tenant executors).
#define FG_HANDLE_POSIX_FD 1

CUresult fg_create_shareable(CUcontext ctx, int dev, size_t size, CUmemGenericAllocationHandle *h) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	if (r) return r;
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof prop);
	prop.type = 1;
	prop.requestedHandleTypes = FG_HANDLE_POSIX_FD;
	prop.location.type = 1;
	prop.location.id = dev;
	return d.cuMemCreate(h, size, &prop, 0);
}

CUresult fg_export(CUcontext ctx, CUmemGenericAllocationHandle h, int *fd) {
	if (!d.cuMemExportToShareableHandle) return 801; /* CUDA_ERROR_NOT_SUPPORTED */
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemExportToShareableHandle(fd, h, FG_HANDLE_POSIX_FD, 0);
}

CUresult fg_import(CUcontext ctx, int fd, CUmemGenericAllocationHandle *h) {
	if (!d.cuMemImportFromShareableHandle) return 801;
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemImportFromShareableHandle(h, (void *)(long)fd, FG_HANDLE_POSIX_FD);
}

CUresult fg_release(CUcontext ctx, CUmemGenericAllocationHandle h) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemRelease(h);
}

CUresult fg_map(CUcontext ctx, CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemMap(p, size, offset, h, 0);
}

CUresult fg_unmap(CUcontext ctx, CUdeviceptr p, size_t size) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemUnmap(p, size);
}

CUresult fg_set_access(CUcontext ctx, CUdeviceptr p, size_t size, const int *devs, int n, int flags) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	if (r) return r;
	CUmemAccessDesc desc[64];
	if (n > 64) n = 64;
	for (int i = 0; i < n; i++) {
		desc[i].location.type = 1;
		desc[i].location.id = devs[i];
		desc[i].flags = flags; // CU_MEM_ACCESS_FLAGS_PROT_READ (1) or _READWRITE (3)
	}
	return d.cuMemSetAccess(p, size, desc, (size_t)n);
}

CUresult fg_host_register(CUcontext ctx, void *p, size_t size) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemHostRegister(p, size, 1); // CU_MEMHOSTREGISTER_PORTABLE
}

CUresult fg_host_unregister(CUcontext ctx, void *p) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemHostUnregister(p);
}

CUresult fg_stream_create(CUcontext ctx, CUstream *s) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuStreamCreate(s, 1); // CU_STREAM_NON_BLOCKING
}

CUresult fg_stream_destroy(CUcontext ctx, CUstream s) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuStreamDestroy(s);
}

CUresult fg_stream_sync(CUcontext ctx, CUstream s) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuStreamSynchronize(s);
}

CUresult fg_stream_query(CUcontext ctx, CUstream s) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuStreamQuery(s);
}

CUresult fg_stream_wait(CUcontext ctx, CUstream s, CUevent e) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuStreamWaitEvent(s, e, 0);
}

CUresult fg_event_create(CUcontext ctx, CUevent *e, int timing) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuEventCreate(e, timing ? 0 : 2); // CU_EVENT_DISABLE_TIMING
}

CUresult fg_event_elapsed(CUcontext ctx, float *ms, CUevent start, CUevent end) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuEventElapsedTime(ms, start, end);
}

CUresult fg_event_record(CUcontext ctx, CUevent e, CUstream s) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuEventRecord(e, s);
}

CUresult fg_event_query(CUcontext ctx, CUevent e) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuEventQuery(e);
}

CUresult fg_event_sync(CUcontext ctx, CUevent e) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuEventSynchronize(e);
}

CUresult fg_event_destroy(CUcontext ctx, CUevent e) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuEventDestroy(e);
}

CUresult fg_htod(CUcontext ctx, CUdeviceptr dst, const void *src, size_t n, CUstream s, int sync) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	if (r || (r = d.cuMemcpyHtoDAsync(dst, src, n, s))) return r;
	return sync ? d.cuStreamSynchronize(s) : 0;
}

CUresult fg_dtoh(CUcontext ctx, void *dst, CUdeviceptr src, size_t n, CUstream s, int sync) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	if (r || (r = d.cuMemcpyDtoHAsync(dst, src, n, s))) return r;
	return sync ? d.cuStreamSynchronize(s) : 0;
}

CUresult fg_dtod(CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemcpyAsync(dst, src, n, s);
}

CUresult fg_memset8(CUcontext ctx, CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemsetD8Async(dst, v, n, s);
}

CUresult fg_memset32(CUcontext ctx, CUdeviceptr dst, unsigned v, size_t n, CUstream s) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuMemsetD32Async(dst, v, n, s);
}

CUresult fg_module_load(CUcontext ctx, CUmodule *m, const void *image) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuModuleLoadData(m, image);
}

CUresult fg_module_unload(CUcontext ctx, CUmodule m) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuModuleUnload(m);
}

CUresult fg_module_function(CUcontext ctx, CUfunction *f, CUmodule m, const char *name) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuModuleGetFunction(f, m, name);
}

CUresult fg_module_global(CUcontext ctx, CUdeviceptr *p, size_t *size, CUmodule m, const char *name) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuModuleGetGlobal(p, size, m, name);
}

// fg_param_info returns 1 with the parameter's offset and size, 0 past the last parameter, -1 when the driver
// cannot report layouts (before CUDA 12.4).
int fg_param_info(CUcontext ctx, CUfunction f, size_t i, size_t *off, size_t *size) {
	if (!d.cuFuncGetParamInfo || d.cuCtxSetCurrent(ctx)) return -1;
	CUresult r = d.cuFuncGetParamInfo(f, i, off, size);
	if (r == 0) return 1;
	return r == 1 ? 0 : -1; // CUDA_ERROR_INVALID_VALUE past the end
}

CUresult fg_launch(CUcontext ctx, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shm, CUstream s, void *args, size_t argsize) {
	CUresult r = d.cuCtxSetCurrent(ctx);
	if (r) return r;
	void *extra[] = {(void *)1, args, (void *)2, &argsize, (void *)0}; // BUFFER_POINTER, BUFFER_SIZE, END
	return d.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, NULL, extra);
}

#define NEED(fn) \
	do { \
		if (!d.fn) return 801; /* CUDA_ERROR_NOT_SUPPORTED: the driver is too old */ \
	} while (0)

CUresult fg_func_attr(CUcontext ctx, CUfunction f, int attr, int *v) {
	NEED(cuFuncGetAttribute);
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuFuncGetAttribute(v, attr, f);
}

CUresult fg_func_set_attr(CUcontext ctx, CUfunction f, int attr, int v) {
	NEED(cuFuncSetAttribute);
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuFuncSetAttribute(f, attr, v);
}

CUresult fg_module_count(CUcontext ctx, CUmodule m, unsigned *n) {
	NEED(cuModuleGetFunctionCount);
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuModuleGetFunctionCount(n, m);
}

// fg_module_names writes the names of the first n functions of m, NUL-separated, into buf (cap bytes); *used
// gets the bytes written. A name that does not fit ends the list.
CUresult fg_module_names(CUcontext ctx, CUmodule m, unsigned n, char *buf, size_t cap, size_t *used) {
	NEED(cuModuleEnumerateFunctions);
	NEED(cuFuncGetName);
	CUresult r = d.cuCtxSetCurrent(ctx);
	if (r) return r;
	CUfunction *fs = calloc(n ? n : 1, sizeof *fs);
	if (!fs) return 2;
	r = d.cuModuleEnumerateFunctions(fs, n, m);
	size_t off = 0;
	for (unsigned i = 0; !r && i < n; i++) {
		const char *name = NULL;
		if ((r = d.cuFuncGetName(&name, fs[i]))) break;
		size_t l = strlen(name) + 1;
		if (off + l > cap) break;
		memcpy(buf + off, name, l);
		off += l;
	}
	free(fs);
	*used = off;
	return r;
}

// CUlaunchConfig and CUlaunchAttribute as cuda.h lays them out on 64-bit platforms.
typedef struct {
	unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
	CUstream hStream;
	void *attrs;
	unsigned numAttrs;
} fg_launch_config;

CUresult fg_launch_ex(CUcontext ctx, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                      unsigned bz, unsigned shm, CUstream s, void *attrs, unsigned nattrs, void *args,
                      size_t argsize) {
	NEED(cuLaunchKernelEx);
	CUresult r = d.cuCtxSetCurrent(ctx);
	if (r) return r;
	fg_launch_config cfg = {gx, gy, gz, bx, by, bz, shm, s, attrs, nattrs};
	void *extra[] = {(void *)1, args, (void *)2, &argsize, (void *)0}; // BUFFER_POINTER, BUFFER_SIZE, END
	return d.cuLaunchKernelEx(&cfg, f, NULL, extra);
}

CUresult fg_tensor_map(CUcontext ctx, int kind, void *out, int dt, unsigned rank, CUdeviceptr gaddr,
                       const unsigned long long *dims, const unsigned long long *strides, const unsigned *box,
                       const unsigned *estrides, int interleave, int swizzle, int l2, int oob, const int *lower,
                       const int *upper, unsigned channels, unsigned pixels, int mode) {
	void *addr = (void *)(size_t)gaddr;
	CUresult r = d.cuCtxSetCurrent(ctx);
	if (r) return r;
	switch (kind) {
	case 1:
		NEED(cuTensorMapEncodeTiled);
		return d.cuTensorMapEncodeTiled(out, dt, rank, addr, dims, strides, box, estrides, interleave, swizzle, l2,
		                                oob);
	case 2:
		NEED(cuTensorMapEncodeIm2col);
		return d.cuTensorMapEncodeIm2col(out, dt, rank, addr, dims, strides, lower, upper, channels, pixels,
		                                 estrides, interleave, swizzle, l2, oob);
	case 3:
		NEED(cuTensorMapEncodeIm2colWide);
		return d.cuTensorMapEncodeIm2colWide(out, dt, rank, addr, dims, strides, lower[0], upper[0], channels,
		                                     pixels, estrides, interleave, mode, swizzle, l2, oob);
	}
	return 1;
}

CUresult fg_tensor_map_replace(CUcontext ctx, void *m, CUdeviceptr gaddr) {
	NEED(cuTensorMapReplaceAddress);
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuTensorMapReplaceAddress(m, (void *)(size_t)gaddr);
}

/* Stream capture in relaxed mode (2): the gpuserver's other goroutines keep calling the driver meanwhile. */
CUresult fg_capture_begin(CUcontext ctx, CUstream s) {
	NEED(cuStreamBeginCapture);
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuStreamBeginCapture(s, 2);
}

/* Ends a capture and instantiates the graph (which is destroyed: the executable graph is what is kept). */
CUresult fg_capture_end(CUcontext ctx, CUstream s, void **exec) {
	NEED(cuStreamEndCapture);
	NEED(cuGraphInstantiateWithFlags);
	NEED(cuGraphDestroy);
	CUresult r = d.cuCtxSetCurrent(ctx);
	if (r) return r;
	void *g = NULL;
	r = d.cuStreamEndCapture(s, &g);
	if (r) return r;
	r = d.cuGraphInstantiateWithFlags(exec, g, 0);
	CUresult r2 = d.cuGraphDestroy(g);
	return r ? r : r2;
}

CUresult fg_graph_launch(CUcontext ctx, void *exec, CUstream s) {
	NEED(cuGraphLaunch);
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuGraphLaunch(exec, s);
}

CUresult fg_graph_exec_destroy(CUcontext ctx, void *exec) {
	NEED(cuGraphExecDestroy);
	CUresult r = d.cuCtxSetCurrent(ctx);
	return r ? r : d.cuGraphExecDestroy(exec);
}
