/*
 * procaddr.c: entry-point discovery as CUDA 12/13 runtimes do it. cudart dlopens libcuda.so.1, looks up
 * cuGetProcAddress_v2 with dlsym, then asks it for every driver function by base name ("cuMemAlloc") and the CUDA
 * version it was built for. The shim implements one ABI variant per function, so a base name resolves to the
 * highest _vN variant exported; per-thread default stream variants (_ptds, _ptsz) resolve to the same functions.
 */
#include <stdio.h>
#include <string.h>

#include "shim.h"

enum { SYMBOL_SUCCESS = 0, SYMBOL_NOT_FOUND = 1 };

static void *find(const char *name) {
	size_t lo = 0, hi = shim_nprocs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(shim_procs[mid].name, name);
		if (c == 0) return shim_procs[mid].fn;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

SHIM_HIDDEN void *shim_lookup(const char *symbol) {
	char name[256];
	static const char *suffixes[] = {"_v4", "_v3", "_v2", ""};
	for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
		if (snprintf(name, sizeof name, "%s%s", symbol, suffixes[i]) >= (int)sizeof name) return NULL;
		void *fn = find(name);
		if (fn != NULL) return fn;
	}
	return NULL;
}

SHIM_EXPORT int cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags,
				    int *symbolStatus) {
	(void)cudaVersion;
	(void)flags;
	if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
	*pfn = shim_lookup(symbol);
	if (symbolStatus != NULL) *symbolStatus = *pfn != NULL ? SYMBOL_SUCCESS : SYMBOL_NOT_FOUND;
	if (*pfn == NULL) {
		if (shim_debug()) shim_log("cuGetProcAddress: %s (CUDA %d) not found", symbol, cudaVersion);
		return CUDA_ERROR_NOT_FOUND;
	}
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags) {
	return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

/* Export tables are private interfaces between cudart/cuBLAS/cuDNN and the driver. None is implemented yet: the
 * UUID asked for is logged so that the GPU suite can record which tables a workload needs. */
SHIM_EXPORT int cuGetExportTable(const void **ppExportTable, const void *pExportTableId) {
	if (ppExportTable == NULL || pExportTableId == NULL) return CUDA_ERROR_INVALID_VALUE;
	*ppExportTable = NULL;
	const uint8_t *u = pExportTableId;
	char name[80];
	snprintf(name, sizeof name,
		 "cuGetExportTable(%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x)", u[0], u[1],
		 u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
	/* shim_unsupported keeps the pointer it logs: use an interned copy. */
	static char interned[64][80];
	static int n;
	for (int i = 0; i < n; i++)
		if (strcmp(interned[i], name) == 0) return shim_unsupported(interned[i]);
	if (n < 64) {
		strcpy(interned[n], name);
		return shim_unsupported(interned[n++]);
	}
	return CUDA_ERROR_NOT_SUPPORTED;
}
