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
		/* The file ends after whichever is last: the section headers, the program headers (ptxas writes them
		 * after the section headers, and the driver needs them), or a section's data. */
		uint64_t shoff, phoff, end;
		uint16_t shentsize, shnum, phentsize, phnum;
		memcpy(&phoff, p + 0x20, 8);
		memcpy(&shoff, p + 0x28, 8);
		memcpy(&phentsize, p + 0x36, 2);
		memcpy(&phnum, p + 0x38, 2);
		memcpy(&shentsize, p + 0x3A, 2);
		memcpy(&shnum, p + 0x3C, 2);
		end = shoff + (uint64_t)shentsize * shnum;
		if (phoff + (uint64_t)phentsize * phnum > end) end = phoff + (uint64_t)phentsize * phnum;
		for (uint16_t i = 0; shentsize >= 0x40 && i < shnum; i++) {
			const uint8_t *sh = p + shoff + (uint64_t)i * shentsize;
			uint32_t type;
			uint64_t off, size;
			memcpy(&type, sh + 0x04, 4);
			memcpy(&off, sh + 0x18, 8);
			memcpy(&size, sh + 0x20, 8);
			if (type != 8 /* SHT_NOBITS */ && off + size > end) end = off + size;
		}
		return (size_t)end;
	}
	return strlen((const char *)p) + 1; /* PTX: NUL-terminated text */
}

/* send_image sends all but the last record's worth of an image as chunks and returns what the load call carries. */
static int send_image(const uint8_t **p, size_t *n) {
	int r = shim_connect();
	if (r != 0) return r;
	uint64_t chunk = shim_chunk_size();
	while (*n > chunk) {
		if ((r = rpc_moduleImageChunk(*p, chunk)) != 0) return r;
		*p += chunk;
		*n -= chunk;
	}
	return CUDA_SUCCESS;
}

int shim_module_load(void **module, const void *image) {
	if (module == NULL || image == NULL) return CUDA_ERROR_INVALID_VALUE;
	const void *start;
	size_t size = shim_image_size(image, &start);
	if (size == 0) return CUDA_ERROR_INVALID_IMAGE;
	const uint8_t *p = start;
	int r = send_image(&p, &size);
	return r != 0 ? r : rpc_cuModuleLoadData(module, p, size);
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
	const uint8_t *p = start;
	int r = send_image(&p, &size);
	return r != 0 ? r : rpc_cuLibraryLoadData(library, p, size);
}

/* --- launches */

#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define ARGS_MAX 32764 /* the CUDA 12.1+ kernel parameter limit, rounded */
#define LAUNCH_ATTRS_MAX 64

/* launch packs the kernel's arguments into one raw buffer (kernelParams by the cached layout, or the buffer of
 * extra) and sends the launch, with its attributes when attrs is not NULL. */
static int launch(void *f, const unsigned grid[3], const unsigned block[3], unsigned shmem, void *stream,
		  void **kernelParams, void **extra, const void *attrs, unsigned nattrs) {
	if (f == NULL) return CUDA_ERROR_INVALID_HANDLE;
	const void *args;
	size_t size = 0;
	uint8_t buf[ARGS_MAX];
	if (extra != NULL) {
		const void *p = NULL;
		for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
			if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
				p = extra[i + 1];
			else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
				memcpy(&size, extra[i + 1], sizeof size);
			else
				return CUDA_ERROR_INVALID_VALUE;
		}
		if (p == NULL && size != 0) return CUDA_ERROR_INVALID_VALUE;
		args = p;
	} else {
		const struct shim_params *p = shim_params_get(f);
		if (p == NULL) {
			shim_log("cuLaunchKernel: no parameter layout for function %p", f);
			return CUDA_ERROR_INVALID_HANDLE;
		}
		if (p->count > 0 && kernelParams == NULL) return CUDA_ERROR_INVALID_VALUE;
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
		args = buf;
	}
	if (attrs == NULL || nattrs == 0)
		return rpc_cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shmem, stream,
					  args, size);
	if (nattrs > LAUNCH_ATTRS_MAX) return CUDA_ERROR_INVALID_VALUE;
	return rpc_cuLaunchKernelEx(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shmem, stream, attrs,
				    (size_t)nattrs * SHIM_LAUNCH_ATTR_SIZE, args, size);
}

SHIM_EXPORT int cuLaunchKernel(void *f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
			       unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
			       unsigned int sharedMemBytes, void *hStream, void **kernelParams, void **extra) {
	unsigned grid[3] = {gridDimX, gridDimY, gridDimZ}, block[3] = {blockDimX, blockDimY, blockDimZ};
	return launch(f, grid, block, sharedMemBytes, hStream, kernelParams, extra, NULL, 0);
}

/* cuLaunchKernelEx carries every launch attribute to the gpuserver, which applies them (clusters, cooperative
 * launches, programmatic dependent launch, priorities, completion events) or refuses the launch. */
SHIM_EXPORT int cuLaunchKernelEx(const struct shim_launch_config *config, void *f, void **kernelParams, void **extra) {
	if (config == NULL || (config->num_attrs > 0 && config->attrs == NULL)) return CUDA_ERROR_INVALID_VALUE;
	return launch(f, config->grid, config->block, config->shmem, config->stream, kernelParams, extra,
		      config->attrs, config->num_attrs);
}

/* cuLaunchCooperativeKernel is a launch with CU_LAUNCH_ATTRIBUTE_COOPERATIVE. */
SHIM_EXPORT int cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
					  unsigned bz, unsigned shmem, void *stream, void **kernelParams) {
	uint8_t attr[SHIM_LAUNCH_ATTR_SIZE];
	memset(attr, 0, sizeof attr);
	uint32_t id = 2, one = 1; /* CU_LAUNCH_ATTRIBUTE_COOPERATIVE */
	memcpy(attr, &id, 4);
	memcpy(attr + 8, &one, 4);
	unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
	return launch(f, grid, block, shmem, stream, kernelParams, NULL, attr, 1);
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
