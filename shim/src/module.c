/*
 * module.c: modules, libraries and kernels, and kernel launches. The server answers cuModuleGetFunction and
 * cuKernelGetFunction with the kernel's parameter layout (from cuFuncGetParamInfo on a real GPU, from the PTX entry
 * on the simulated node); the shim caches it per handle and packs kernelParams into one raw argument buffer, which
 * the server passes to the launch unchanged (device addresses are the same on every GPU).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

/* --- image sizes: PTX text, ELF cubin, fatbin, or the fatbin wrapper a compiler emits */

#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_WRAPPER_MAGIC 0x466243B1u

SHIM_HIDDEN size_t shim_image_size(const void *image, const void **start) {
	const uint8_t *p = image;
	uint32_t magic;
	memcpy(&magic, p, 4);
	*start = image;
	if (magic == FATBIN_WRAPPER_MAGIC) {
		const void *data;
		memcpy(&data, p + 8, sizeof data);
		return data == NULL ? 0 : shim_image_size(data, start);
	}
	if (magic == FATBIN_MAGIC) {
		uint16_t hdr;
		uint64_t size;
		memcpy(&hdr, p + 6, 2);
		memcpy(&size, p + 8, 8);
		return (size_t)hdr + (size_t)size;
	}
	if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F' && p[4] == 2 /* ELFCLASS64 */) {
		uint64_t shoff;
		uint16_t shentsize, shnum;
		memcpy(&shoff, p + 0x28, 8);
		memcpy(&shentsize, p + 0x3A, 2);
		memcpy(&shnum, p + 0x3C, 2);
		return (size_t)(shoff + (uint64_t)shentsize * shnum);
	}
	return strlen((const char *)p) + 1; /* PTX: NUL-terminated text */
}

int shim_module_load(void **module, const void *image) {
	if (module == NULL || image == NULL) return CUDA_ERROR_INVALID_VALUE;
	const void *start;
	size_t size = shim_image_size(image, &start);
	if (size == 0) return CUDA_ERROR_INVALID_IMAGE;
	return rpc_cuModuleLoadData(module, start, size);
}

SHIM_EXPORT int cuModuleLoadData(void **module, const void *image) { return shim_module_load(module, image); }

/* JIT options are not forwarded: the server compiles with its defaults. */
SHIM_EXPORT int cuModuleLoadDataEx(void **module, const void *image, unsigned int numOptions, void *options,
				   void **optionValues) {
	(void)numOptions;
	(void)options;
	(void)optionValues;
	return shim_module_load(module, image);
}

SHIM_EXPORT int cuModuleLoadFatBinary(void **module, const void *fatCubin) { return shim_module_load(module, fatCubin); }

SHIM_EXPORT int cuLibraryLoadData(void **library, const void *code, void *jitOptions, void **jitOptionsValues,
				  unsigned int numJitOptions, void *libraryOptions, void **libraryOptionValues,
				  unsigned int numLibraryOptions) {
	(void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
	(void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
	if (library == NULL || code == NULL) return CUDA_ERROR_INVALID_VALUE;
	const void *start;
	size_t size = shim_image_size(code, &start);
	if (size == 0) return CUDA_ERROR_INVALID_IMAGE;
	return rpc_cuLibraryLoadData(library, start, size);
}

/* --- parameter layouts by function or kernel handle */

#define LAYOUT_WIRE (4 + 8 * SHIM_PARAM_MAX)
#define TABLE_SIZE 4096

static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
	void *key;
	struct shim_params *p;
} table[TABLE_SIZE];

void shim_params_put(void *func, const uint8_t *wire, size_t len) {
	if (len < 4) return;
	struct shim_params *p = calloc(1, sizeof *p);
	if (p == NULL) return;
	uint32_t count;
	memcpy(&count, wire, 4);
	if (count > SHIM_PARAM_MAX || 4 + 8 * (size_t)count > len) count = 0;
	p->count = count;
	for (uint32_t i = 0; i < count; i++) {
		memcpy(&p->offset[i], wire + 4 + 8 * i, 4);
		memcpy(&p->size[i], wire + 8 + 8 * i, 4);
	}
	size_t h = ((uintptr_t)func >> 3) % TABLE_SIZE;
	pthread_mutex_lock(&table_mu);
	for (size_t i = 0; i < TABLE_SIZE; i++) {
		size_t j = (h + i) % TABLE_SIZE;
		if (table[j].key == NULL || table[j].key == func) {
			free(table[j].p);
			table[j].key = func;
			table[j].p = p;
			p = NULL;
			break;
		}
	}
	pthread_mutex_unlock(&table_mu);
	if (p != NULL) {
		shim_log("more than %d kernel handles: parameter layout not cached", TABLE_SIZE);
		free(p);
	}
}

const struct shim_params *shim_params_get(void *func) {
	const struct shim_params *p = NULL;
	size_t h = ((uintptr_t)func >> 3) % TABLE_SIZE;
	pthread_mutex_lock(&table_mu);
	for (size_t i = 0; i < TABLE_SIZE; i++) {
		size_t j = (h + i) % TABLE_SIZE;
		if (table[j].key == NULL) break;
		if (table[j].key == func) {
			p = table[j].p;
			break;
		}
	}
	pthread_mutex_unlock(&table_mu);
	return p;
}

SHIM_EXPORT int cuModuleGetFunction(void **hfunc, void *hmod, const char *name) {
	uint8_t wire[LAYOUT_WIRE];
	if (hfunc == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = rpc_cuModuleGetFunction(hfunc, wire, hmod, name);
	if (r == 0) shim_params_put(*hfunc, wire, sizeof wire);
	return r;
}

SHIM_EXPORT int cuKernelGetFunction(void **pFunc, void *kernel) {
	uint8_t wire[LAYOUT_WIRE];
	if (pFunc == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = rpc_cuKernelGetFunction(pFunc, wire, kernel);
	if (r == 0) shim_params_put(*pFunc, wire, sizeof wire);
	return r;
}

/* layout returns the parameter layout of a function, or of a kernel handle passed as one (CUDA 12 allows it). */
static const struct shim_params *layout(void *f) {
	const struct shim_params *p = shim_params_get(f);
	if (p != NULL) return p;
	uint8_t wire[LAYOUT_WIRE];
	void *func;
	if (rpc_cuKernelGetFunction(&func, wire, f) != 0) return NULL;
	shim_params_put(f, wire, sizeof wire);
	return shim_params_get(f);
}

SHIM_EXPORT int cuFuncGetParamInfo(void *func, size_t paramIndex, size_t *paramOffset, size_t *paramSize) {
	const struct shim_params *p = layout(func);
	if (p == NULL) return CUDA_ERROR_INVALID_HANDLE;
	if (paramIndex >= p->count) return CUDA_ERROR_INVALID_VALUE;
	if (paramOffset != NULL) *paramOffset = p->offset[paramIndex];
	if (paramSize != NULL) *paramSize = p->size[paramIndex];
	return CUDA_SUCCESS;
}

/* --- launches */

#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define ARGS_MAX 32764 /* the CUDA 12.1+ kernel parameter limit, rounded */

static int launch(void *f, const unsigned grid[3], const unsigned block[3], unsigned shmem, void *stream,
		  void **kernelParams, void **extra) {
	if (f == NULL) return CUDA_ERROR_INVALID_HANDLE;
	if (extra != NULL) {
		const void *buf = NULL;
		size_t size = 0;
		for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
			if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
				buf = extra[i + 1];
			else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
				memcpy(&size, extra[i + 1], sizeof size);
			else
				return CUDA_ERROR_INVALID_VALUE;
		}
		if (buf == NULL && size != 0) return CUDA_ERROR_INVALID_VALUE;
		return rpc_cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shmem, stream,
					  buf, size);
	}
	const struct shim_params *p = layout(f);
	if (p == NULL) {
		shim_log("cuLaunchKernel: no parameter layout for function %p", f);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	if (p->count > 0 && kernelParams == NULL) return CUDA_ERROR_INVALID_VALUE;
	uint8_t buf[ARGS_MAX];
	size_t size = 0;
	for (uint32_t i = 0; i < p->count; i++) {
		size_t end = (size_t)p->offset[i] + p->size[i];
		if (end > sizeof buf) return CUDA_ERROR_INVALID_VALUE;
		if (end > size) {
			memset(buf + size, 0, end - size);
			size = end;
		}
		if (kernelParams[i] == NULL) return CUDA_ERROR_INVALID_VALUE;
		memcpy(buf + p->offset[i], kernelParams[i], p->size[i]);
	}
	return rpc_cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shmem, stream, buf, size);
}

SHIM_EXPORT int cuLaunchKernel(void *f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
			       unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
			       unsigned int sharedMemBytes, void *hStream, void **kernelParams, void **extra) {
	unsigned grid[3] = {gridDimX, gridDimY, gridDimZ}, block[3] = {blockDimX, blockDimY, blockDimZ};
	return launch(f, grid, block, sharedMemBytes, hStream, kernelParams, extra);
}

/* CUlaunchConfig as laid out by cuda.h on 64-bit platforms. */
struct launch_config {
	unsigned grid[3];
	unsigned block[3];
	unsigned shmem;
	void *stream;
	void *attrs;
	unsigned num_attrs;
};

SHIM_EXPORT int cuLaunchKernelEx(const struct launch_config *config, void *f, void **kernelParams, void **extra) {
	if (config == NULL) return CUDA_ERROR_INVALID_VALUE;
	if (config->num_attrs > 0) {
		static int logged;
		if (!__atomic_exchange_n(&logged, 1, __ATOMIC_SEQ_CST))
			shim_log("cuLaunchKernelEx: launch attributes are ignored (cooperative, clusters, priority)");
	}
	return launch(f, config->grid, config->block, config->shmem, config->stream, kernelParams, extra);
}

/* --- loading mode: lazy unless CUDA_MODULE_LOADING=EAGER, as the driver does since CUDA 12.2 */

enum { CU_MODULE_EAGER_LOADING = 1, CU_MODULE_LAZY_LOADING = 2 };

SHIM_EXPORT int cuModuleGetLoadingMode(int *mode) {
	SHIM_LOCAL();
	if (mode == NULL) return CUDA_ERROR_INVALID_VALUE;
	const char *v = getenv("CUDA_MODULE_LOADING");
	*mode = v != NULL && strcmp(v, "EAGER") == 0 ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
	return CUDA_SUCCESS;
}
