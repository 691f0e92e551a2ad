// ctx.c: CUDA contexts of their own (cuCtxCreate, cuCtxDestroy), the isolation domains of device.Context. The
// driver library is opened a second time by its path (dlopen counts references and returns the same library).
#include <dlfcn.h>
#include <stdio.h>

#include "cu.h"

static struct {
	void *h;
	CUresult (*create2)(CUcontext *, unsigned, CUdevice);
	CUresult (*create4)(CUcontext *, void *, unsigned, CUdevice);
	CUresult (*destroy)(CUcontext);
	CUresult (*pop)(CUcontext *);
	CUresult (*attribute)(int *, int, CUdevice);
} c;

int fg_ctx_load(const char *path, char *err, int errlen) {
	if (c.h) return 0;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return -1;
	}
	*(void **)(&c.create2) = dlsym(h, "cuCtxCreate_v2");
	*(void **)(&c.create4) = dlsym(h, "cuCtxCreate_v4");
	*(void **)(&c.destroy) = dlsym(h, "cuCtxDestroy_v2");
	*(void **)(&c.pop) = dlsym(h, "cuCtxPopCurrent_v2");
	*(void **)(&c.attribute) = dlsym(h, "cuDeviceGetAttribute");
	if ((!c.create2 && !c.create4) || !c.destroy || !c.pop || !c.attribute) {
		snprintf(err, errlen, "libcuda: missing cuCtxCreate, cuCtxDestroy_v2, cuCtxPopCurrent_v2 or cuDeviceGetAttribute");
		return -1;
	}
	c.h = h;
	return 0;
}

// fg_ctx_create creates a context on dev and pops it off the calling thread's stack: every call of cu.c sets the
// context it works in current itself.
CUresult fg_ctx_create(CUdevice dev, CUcontext *ctx) {
	CUresult r = c.create2 ? c.create2(ctx, 0, dev) : c.create4(ctx, NULL, 0, dev);
	if (r) return r;
	CUcontext popped;
	return c.pop(&popped);
}

CUresult fg_ctx_destroy(CUcontext ctx) { return c.destroy(ctx); }

CUresult fg_attribute(int attr, CUdevice dev, int *v) { return c.attribute(v, attr, dev); }
