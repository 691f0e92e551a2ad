package cu

/*
#include <stdlib.h>
#include "cu.h"
int fg_ctx_load(const char *path, char *err, int errlen);
CUresult fg_ctx_create(CUdevice dev, CUcontext *ctx);
CUresult fg_ctx_destroy(CUcontext ctx);
CUresult fg_attribute(int attr, CUdevice dev, int *v);
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// LoadContexts resolves the context calls (cuCtxCreate, cuCtxDestroy) from the driver library at path (the one
// Load opened).
func LoadContexts(path string) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	if C.fg_ctx_load(cpath, &buf[0], C.int(len(buf))) != 0 {
		return fmt.Errorf("load %s: %s", path, C.GoString(&buf[0]))
	}
	return nil
}

// CtxCreate creates a context of its own on dev (not current on any thread afterwards).
func CtxCreate(dev int) (Context, error) {
	var ctx C.CUcontext
	err := check("cuCtxCreate", C.fg_ctx_create(C.CUdevice(dev), &ctx))
	return Context(ctx), err
}

// CtxDestroy destroys a context made by CtxCreate, and everything created in it.
func CtxDestroy(ctx Context) error {
	return check("cuCtxDestroy", C.fg_ctx_destroy(C.CUcontext(ctx)))
}

// Device attributes the gpuserver's isolation depends on (CUdevice_attribute).
const (
	// AttrPageableMemoryAccess: kernels can read and write pageable host memory (HMM, ATS).
	AttrPageableMemoryAccess = 88
	// AttrHostPointerForRegisteredMem: kernels can use the host pointer of registered host memory.
	AttrHostPointerForRegisteredMem = 91
)

// DeviceAttribute reads one attribute of dev.
func DeviceAttribute(attr, dev int) (int, error) {
	var v C.int
	err := check("cuDeviceGetAttribute", C.fg_attribute(C.int(attr), C.CUdevice(dev), &v))
	return int(v), err
}
