/*
 * func.c: what the shim knows about functions and kernels. The gpuserver answers cuModuleGetFunction,
 * cuLibraryGetKernel and cuKernelGetFunction with a handle (a kernel and its function share one) and the kernel's
 * parameter layout; the shim keeps, per handle, the layout, the name, the module or library it came from and the
 * attributes read so far. cuFuncGetParamInfo, names, modules, libraries and repeated attribute reads then cost no
 * round trip: cuBLAS and PyTorch ask them around every kernel they first use. Attribute sets go to the gpuserver
 * (which replays them on every GPU the kernel runs on) and update the cache.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define ATTRS 16 /* CUfunction_attribute values 0..15 */
#define LAYOUT_WIRE (4 + 8 * SHIM_PARAM_MAX)
#define NAME_MAX_WIRE 4096

struct func {
	void *handle;
	void *module; /* module or library it came from; NULL until known */
	char *name;   /* NULL until known */
	int has_params;
	struct shim_params params;
	uint32_t attr_valid; /* bit a: attr[a] holds the attribute's value */
	int attr[ATTRS];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct func **slots; /* open addressing by handle; records are never freed (handles are not reused) */
static size_t nslots, nused;

static size_t hash(void *h) { return (size_t)(((uintptr_t)h >> 4) * 0x9E3779B97F4A7C15ull); }

/* lookup returns the record of handle h, creating it when create is set (NULL on allocation failure). Called with
 * mu held. */
static struct func *lookup(void *h, int create) {
	if (nslots > 0) {
		for (size_t i = hash(h) & (nslots - 1);; i = (i + 1) & (nslots - 1)) {
			if (slots[i] == NULL) break;
			if (slots[i]->handle == h) return slots[i];
		}
	}
	if (!create) return NULL;
	if (2 * (nused + 1) > nslots) {
		size_t n = nslots ? 2 * nslots : 1024;
		struct func **s = calloc(n, sizeof *s);
		if (s == NULL) return NULL;
		for (size_t i = 0; i < nslots; i++) {
			if (slots[i] == NULL) continue;
			size_t j = hash(slots[i]->handle) & (n - 1);
			while (s[j] != NULL) j = (j + 1) & (n - 1);
			s[j] = slots[i];
		}
		free(slots);
		slots = s;
		nslots = n;
	}
	struct func *f = calloc(1, sizeof *f);
	if (f == NULL) return NULL;
	f->handle = h;
	size_t i = hash(h) & (nslots - 1);
	while (slots[i] != NULL) i = (i + 1) & (nslots - 1);
	slots[i] = f;
	nused++;
	return f;
}

/* remember records what a lookup by name taught: the handle's module, name and parameter layout. */
static void remember(void *h, void *module, const char *name, const uint8_t *wire) {
	pthread_mutex_lock(&mu);
	struct func *f = lookup(h, 1);
	if (f != NULL) {
		if (module != NULL) f->module = module;
		if (name != NULL && f->name == NULL) f->name = strdup(name);
		if (wire != NULL) {
			uint32_t count;
			memcpy(&count, wire, 4);
			if (count > SHIM_PARAM_MAX) count = 0;
			f->params.count = count;
			for (uint32_t i = 0; i < count; i++) {
				memcpy(&f->params.offset[i], wire + 4 + 8 * i, 4);
				memcpy(&f->params.size[i], wire + 8 + 8 * i, 4);
			}
			f->has_params = 1;
		}
	}
	pthread_mutex_unlock(&mu);
}

/* shim_params_get returns the parameter layout of a function or kernel handle, asking the gpuserver the first
 * time (a kernel handle passed as a function, as CUDA 12 allows). */
const struct shim_params *shim_params_get(void *h) {
	pthread_mutex_lock(&mu);
	struct func *f = lookup(h, 0);
	const struct shim_params *p = f != NULL && f->has_params ? &f->params : NULL;
	pthread_mutex_unlock(&mu);
	if (p != NULL) return p;
	uint8_t wire[LAYOUT_WIRE];
	void *fn;
	if (rpc_cuKernelGetFunction(&fn, wire, h) != 0) return NULL;
	remember(h, NULL, NULL, wire);
	pthread_mutex_lock(&mu);
	f = lookup(h, 0);
	p = f != NULL && f->has_params ? &f->params : NULL;
	pthread_mutex_unlock(&mu);
	return p;
}

/* ---- lookups by name */

SHIM_EXPORT int cuModuleGetFunction(void **hfunc, void *hmod, const char *name) {
	uint8_t wire[LAYOUT_WIRE];
	if (hfunc == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = rpc_cuModuleGetFunction(hfunc, wire, hmod, name);
	if (r == 0) remember(*hfunc, hmod, name, wire);
	return r;
}

SHIM_EXPORT int cuLibraryGetKernel(void **pKernel, void *library, const char *name) {
	if (pKernel == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = rpc_cuLibraryGetKernel(pKernel, library, name);
	if (r == 0) remember(*pKernel, library, name, NULL);
	return r;
}

SHIM_EXPORT int cuKernelGetFunction(void **pFunc, void *kernel) {
	if (pFunc == NULL) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	struct func *f = lookup(kernel, 0);
	int known = f != NULL && f->has_params;
	pthread_mutex_unlock(&mu);
	if (known) { /* a kernel is its own function on the gpuserver */
		SHIM_LOCAL();
		*pFunc = kernel;
		return CUDA_SUCCESS;
	}
	uint8_t wire[LAYOUT_WIRE];
	int r = rpc_cuKernelGetFunction(pFunc, wire, kernel);
	if (r == 0) remember(*pFunc, NULL, NULL, wire);
	return r;
}

/* ---- parameter layouts */

SHIM_EXPORT int cuFuncGetParamInfo(void *func, size_t paramIndex, size_t *paramOffset, size_t *paramSize) {
	SHIM_LOCAL();
	const struct shim_params *p = shim_params_get(func);
	if (p == NULL) return CUDA_ERROR_INVALID_HANDLE;
	if (paramIndex >= p->count) return CUDA_ERROR_INVALID_VALUE;
	if (paramOffset != NULL) *paramOffset = p->offset[paramIndex];
	if (paramSize != NULL) *paramSize = p->size[paramIndex];
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuKernelGetParamInfo(void *kernel, size_t paramIndex, size_t *paramOffset, size_t *paramSize) {
	return cuFuncGetParamInfo(kernel, paramIndex, paramOffset, paramSize);
}

/* ---- names, modules, libraries */

static int name_of(void *h, const char **name) {
	SHIM_LOCAL();
	if (name == NULL || h == NULL) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	struct func *f = lookup(h, 0);
	*name = f != NULL ? f->name : NULL;
	pthread_mutex_unlock(&mu);
	if (*name != NULL) return CUDA_SUCCESS;
	char buf[NAME_MAX_WIRE];
	int r = rpc_funcGetName(buf, h);
	if (r != 0) return r;
	buf[sizeof buf - 1] = 0;
	remember(h, NULL, buf, NULL);
	pthread_mutex_lock(&mu);
	f = lookup(h, 0);
	*name = f != NULL ? f->name : NULL;
	pthread_mutex_unlock(&mu);
	return *name != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

SHIM_EXPORT int cuFuncGetName(const char **name, void *hfunc) { return name_of(hfunc, name); }
SHIM_EXPORT int cuKernelGetName(const char **name, void *kernel) { return name_of(kernel, name); }

static int module_of(void *h, void **module) {
	SHIM_LOCAL();
	if (module == NULL) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	struct func *f = lookup(h, 0);
	*module = f != NULL ? f->module : NULL;
	pthread_mutex_unlock(&mu);
	return *module != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* A module and a library share one handle on the gpuserver (cuLibraryGetModule answers the library itself). */
SHIM_EXPORT int cuFuncGetModule(void **hmod, void *hfunc) { return module_of(hfunc, hmod); }
SHIM_EXPORT int cuKernelGetLibrary(void **pLib, void *kernel) { return module_of(kernel, pLib); }

enum { FUNCTION_LOADING_STATE_LOADED = 1 };

/* Modules load whole on the gpuserver: every function is loaded. */
SHIM_EXPORT int cuFuncIsLoaded(int *state, void *hfunc) {
	SHIM_LOCAL();
	if (state == NULL || hfunc == NULL) return CUDA_ERROR_INVALID_VALUE;
	*state = FUNCTION_LOADING_STATE_LOADED;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuFuncLoad(void *hfunc) {
	SHIM_LOCAL();
	return hfunc == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

/* ---- enumeration */

SHIM_EXPORT int cuLibraryGetKernelCount(unsigned int *count, void *library) {
	if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
	return rpc_cuLibraryGetKernelCount(count, library);
}

SHIM_EXPORT int cuLibraryEnumerateKernels(void **kernels, unsigned int numKernels, void *library) {
	if (kernels == NULL && numKernels > 0) return CUDA_ERROR_INVALID_VALUE;
	int r = rpc_cuLibraryEnumerateKernels(kernels, numKernels, library);
	if (r == 0)
		for (unsigned i = 0; i < numKernels; i++) remember(kernels[i], library, NULL, NULL);
	return r;
}

SHIM_EXPORT int cuModuleGetFunctionCount(unsigned int *count, void *mod) { return cuLibraryGetKernelCount(count, mod); }

SHIM_EXPORT int cuModuleEnumerateFunctions(void **functions, unsigned int numFunctions, void *mod) {
	return cuLibraryEnumerateKernels(functions, numFunctions, mod);
}

/* ---- attributes */

/* cached_attr reads attribute a of h from the cache (counted as a local call when count_hit is set), or asks the
 * gpuserver and caches the answer. */
static int cached_attr(void *h, int a, int *pi, int count_hit) {
	if (pi == NULL) return CUDA_ERROR_INVALID_VALUE;
	if (a < 0 || a >= ATTRS) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	struct func *f = lookup(h, 0);
	int hit = f != NULL && (f->attr_valid & (1u << a));
	if (hit) *pi = f->attr[a];
	pthread_mutex_unlock(&mu);
	if (hit) {
		if (count_hit) SHIM_LOCAL();
		return CUDA_SUCCESS;
	}
	int r = rpc_cuFuncGetAttribute(pi, a, h);
	if (r != 0) return r;
	pthread_mutex_lock(&mu);
	f = lookup(h, 1);
	if (f != NULL) {
		f->attr[a] = *pi;
		f->attr_valid |= 1u << a;
	}
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

static void cache_set(void *h, int a, int v) {
	pthread_mutex_lock(&mu);
	struct func *f = lookup(h, 1);
	if (f != NULL && a >= 0 && a < ATTRS) {
		f->attr[a] = v;
		f->attr_valid |= 1u << a;
	}
	pthread_mutex_unlock(&mu);
}

SHIM_EXPORT int cuFuncGetAttribute(int *pi, int attrib, void *hfunc) {
	return cached_attr(hfunc, attrib, pi, 1); /* a local call when cached, otherwise a remoted one */
}

SHIM_EXPORT int cuKernelGetAttribute(int *pi, int attrib, void *kernel, int dev) {
	if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
	return cuFuncGetAttribute(pi, attrib, kernel);
}

/* CUfunction_attribute values that can be set, and the device's opt-in shared memory limit. */
enum { FA_SHARED_SIZE_BYTES = 1, FA_MAX_DYNAMIC_SHARED = 8, DA_MAX_SHARED_PER_BLOCK_OPTIN = 97 };

static int settable(int a) { return a == 8 || a == 9 || (a >= 11 && a <= 15); }

/* Sets are fire-and-forget: the gpuserver applies them on every GPU the kernel runs on. What the driver refuses at
 * once is refused here at once: an attribute that cannot be set, a dynamic shared memory size beyond the device's
 * opt-in limit less the kernel's static shared memory. */
SHIM_EXPORT int cuFuncSetAttribute(void *hfunc, int attrib, int value) {
	if (hfunc == NULL) return CUDA_ERROR_INVALID_HANDLE;
	if (!settable(attrib)) return CUDA_ERROR_INVALID_VALUE;
	if (attrib == FA_MAX_DYNAMIC_SHARED) {
		int r = shim_connect(), static_shared = 0;
		if (r != 0 || (r = cached_attr(hfunc, FA_SHARED_SIZE_BYTES, &static_shared, 0)) != 0) return r;
		const struct shim_device *d = shim_device();
		if (value < 0 || (d != NULL && value > d->attrs[DA_MAX_SHARED_PER_BLOCK_OPTIN] - static_shared))
			return CUDA_ERROR_INVALID_VALUE;
	}
	int r = rpc_cuFuncSetAttribute(hfunc, attrib, value);
	if (r == 0) cache_set(hfunc, attrib, value);
	return r;
}

SHIM_EXPORT int cuKernelSetAttribute(int attrib, int val, void *kernel, int dev) {
	if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
	return cuFuncSetAttribute(kernel, attrib, val);
}

int cuFuncSetCacheConfig(void *, int);

SHIM_EXPORT int cuKernelSetCacheConfig(void *kernel, int config, int dev) {
	if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
	return cuFuncSetCacheConfig(kernel, config);
}

/* shim_func_attr reads a function attribute for the occupancy calculator (cached). */
int shim_func_attr(void *h, int a, int *v) { return cached_attr(h, a, v, 0); }
