// Types of the CUDA driver API used by faas-gpu, declared here so that no CUDA header is needed to build.
#ifndef FAAS_GPU_CU_H
#define FAAS_GPU_CU_H
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUmodule;
typedef void *CUfunction;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct {
	int type;
	int id;
} CUmemLocation;

typedef struct {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

typedef struct {
	CUmemLocation location;
	int flags;
} CUmemAccessDesc;

int fg_load(const char *path, char *err, int errlen);
const char *fg_error_string(CUresult r);
CUresult fg_init(void);
CUresult fg_device_count(int *n);
CUresult fg_device_open(int ordinal, CUdevice *dev, CUcontext *ctx);
CUresult fg_device_close(CUdevice dev);
CUresult fg_device_info(CUcontext ctx, CUdevice dev, char *name, int namelen, char *bus, int buslen, size_t *total,
                        int *major, int *minor, size_t *gran);
CUresult fg_device_uuid(CUdevice dev, unsigned char *uuid);
CUresult fg_device_attrs(CUdevice dev, int *vals, int n);
CUresult fg_can_access_peer(int *can, CUdevice a, CUdevice b);
CUresult fg_mem_info(CUcontext ctx, size_t *free, size_t *total);
CUresult fg_reserve(CUcontext ctx, CUdeviceptr *p, size_t size, size_t align);
CUresult fg_reserve_at(CUcontext ctx, CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr);
CUresult fg_address_free(CUcontext ctx, CUdeviceptr p, size_t size);
CUresult fg_create(CUcontext ctx, int dev, size_t size, CUmemGenericAllocationHandle *h);
CUresult fg_release(CUcontext ctx, CUmemGenericAllocationHandle h);
CUresult fg_create_shareable(CUcontext ctx, int dev, size_t size, CUmemGenericAllocationHandle *h);
CUresult fg_export(CUcontext ctx, CUmemGenericAllocationHandle h, int *fd);
CUresult fg_import(CUcontext ctx, int fd, CUmemGenericAllocationHandle *h);
CUresult fg_map(CUcontext ctx, CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h);
CUresult fg_unmap(CUcontext ctx, CUdeviceptr p, size_t size);
CUresult fg_capture_begin(CUcontext ctx, CUstream s);
CUresult fg_capture_end(CUcontext ctx, CUstream s, void **exec);
CUresult fg_graph_launch(CUcontext ctx, void *exec, CUstream s);
CUresult fg_graph_exec_destroy(CUcontext ctx, void *exec);
CUresult fg_set_access(CUcontext ctx, CUdeviceptr p, size_t size, const int *devs, int n, int flags);
CUresult fg_host_register(CUcontext ctx, void *p, size_t size);
CUresult fg_host_unregister(CUcontext ctx, void *p);
CUresult fg_stream_create(CUcontext ctx, CUstream *s);
CUresult fg_stream_destroy(CUcontext ctx, CUstream s);
CUresult fg_stream_sync(CUcontext ctx, CUstream s);
CUresult fg_stream_query(CUcontext ctx, CUstream s);
CUresult fg_stream_wait(CUcontext ctx, CUstream s, CUevent e);
CUresult fg_event_create(CUcontext ctx, CUevent *e, int timing);
CUresult fg_event_elapsed(CUcontext ctx, float *ms, CUevent start, CUevent end);
CUresult fg_event_record(CUcontext ctx, CUevent e, CUstream s);
CUresult fg_event_query(CUcontext ctx, CUevent e);
CUresult fg_event_sync(CUcontext ctx, CUevent e);
CUresult fg_event_destroy(CUcontext ctx, CUevent e);
CUresult fg_htod(CUcontext ctx, CUdeviceptr dst, const void *src, size_t n, CUstream s, int sync);
CUresult fg_dtoh(CUcontext ctx, void *dst, CUdeviceptr src, size_t n, CUstream s, int sync);
CUresult fg_dtod(CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult fg_memset8(CUcontext ctx, CUdeviceptr dst, unsigned char v, size_t n, CUstream s);
CUresult fg_memset32(CUcontext ctx, CUdeviceptr dst, unsigned v, size_t n, CUstream s);
CUresult fg_module_load(CUcontext ctx, CUmodule *m, const void *image);
CUresult fg_module_unload(CUcontext ctx, CUmodule m);
CUresult fg_module_function(CUcontext ctx, CUfunction *f, CUmodule m, const char *name);
CUresult fg_module_global(CUcontext ctx, CUdeviceptr *p, size_t *size, CUmodule m, const char *name);
int fg_param_info(CUcontext ctx, CUfunction f, size_t i, size_t *off, size_t *size);
CUresult fg_launch(CUcontext ctx, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shm, CUstream s, void *args, size_t argsize);
CUresult fg_func_attr(CUcontext ctx, CUfunction f, int attr, int *v);
CUresult fg_func_set_attr(CUcontext ctx, CUfunction f, int attr, int v);
CUresult fg_module_count(CUcontext ctx, CUmodule m, unsigned *n);
CUresult fg_module_names(CUcontext ctx, CUmodule m, unsigned n, char *buf, size_t cap, size_t *used);
CUresult fg_launch_ex(CUcontext ctx, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                      unsigned bz, unsigned shm, CUstream s, void *attrs, unsigned nattrs, void *args,
                      size_t argsize);
CUresult fg_tensor_map(CUcontext ctx, int kind, void *out, int dt, unsigned rank, CUdeviceptr gaddr,
                       const unsigned long long *dims, const unsigned long long *strides, const unsigned *box,
                       const unsigned *estrides, int interleave, int swizzle, int l2, int oob, const int *lower,
                       const int *upper, unsigned channels, unsigned pixels, int mode);
CUresult fg_tensor_map_replace(CUcontext ctx, void *m, CUdeviceptr gaddr);
#endif
