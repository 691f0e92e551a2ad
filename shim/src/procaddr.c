/*
 * procaddr.c: entry-point discovery as CUDA 12/13 runtimes do it. cudart dlopens libcuda.so.1, looks up
 * cuGetProcAddress_v2 with dlsym, then asks it for every driver function by base name ("cuMemAlloc") and the CUDA
 * version it was built for. Like the driver, the shim answers with the variant of that base name current at that
 * version (cuCtxCreate at 13000 is cuCtxCreate_v4, at 11040 cuCtxCreate_v3), and with its per-thread default
 * stream variant (_ptds, _ptsz) when the caller asks for one. The table of variants is generated from the API
 * table's entries (shim/api/cuda.api).
 */
#include <stdio.h>
#include <string.h>

#include "shim.h"

/* cuGetProcAddress flags and CUdriverProcAddressQueryResult values. */
enum { PROC_PER_THREAD_DEFAULT_STREAM = 2 };
enum { SYMBOL_SUCCESS = 0, SYMBOL_NOT_FOUND = 1, VERSION_NOT_SUFFICIENT = 2 };

static const struct shim_entry *find_entry(const char *base) {
	size_t lo = 0, hi = shim_nentries;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(shim_entries[mid].base, base);
		if (c == 0) return &shim_entries[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

SHIM_HIDDEN void *shim_symbol(const char *symbol) {
	size_t lo = 0, hi = shim_nprocs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(shim_procs[mid].name, symbol);
		if (c == 0) return shim_procs[mid].fn;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

SHIM_HIDDEN const struct shim_variant *shim_resolve(const char *base, int version, int per_thread, int *status) {
	const struct shim_entry *e = find_entry(base);
	if (e == NULL) {
		*status = SYMBOL_NOT_FOUND;
		return NULL;
	}
	const struct shim_variant *plain = NULL, *pt = NULL;
	for (unsigned i = e->first; i < e->first + e->count; i++) {
		const struct shim_variant *v = &shim_variants[i];
		if (v->version > version) break;
		if (v->per_thread)
			pt = v;
		else
			plain = v;
	}
	/* A per-thread variant older than the plain one current at this version belongs to an older ABI. */
	if (per_thread && pt != NULL && plain != NULL && pt->version >= plain->version) plain = pt;
	*status = plain != NULL ? SYMBOL_SUCCESS : VERSION_NOT_SUFFICIENT;
	return plain;
}

SHIM_EXPORT int cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags,
				    int *symbolStatus) {
	if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
	int status;
	const struct shim_variant *v =
		shim_resolve(symbol, cudaVersion, (flags & PROC_PER_THREAD_DEFAULT_STREAM) != 0, &status);
	*pfn = v != NULL ? v->fn : NULL;
	if (shim_debug() > 1)
		shim_log("cuGetProcAddress(%s, %d, %#llx) -> %s", symbol, cudaVersion, flags, v != NULL ? v->symbol : "-");
	if (symbolStatus != NULL) *symbolStatus = status;
	if (v == NULL) {
		if (shim_debug() > 1)
			shim_log("cuGetProcAddress: %s (CUDA %d) %s", symbol, cudaVersion,
				 status == SYMBOL_NOT_FOUND ? "not found" : "needs a newer CUDA version");
		return CUDA_ERROR_NOT_FOUND;
	}
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags) {
	return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
