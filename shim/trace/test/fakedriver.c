/*
 * fakedriver.c: a stand-in for the real libcuda.so.1 in the trace library's test: exported functions with many
 * integer arguments (some on the stack) and floating-point arguments, functions reachable only through
 * cuGetProcAddress, and two private tables (one with a size header and a data word, one without).
 */
#include <stdint.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT int cuInit(unsigned flags) { return flags == 0 ? 0 : 1; }
EXPORT int cuDriverGetVersion(int *v) {
	*v = 13000;
	return 0;
}
EXPORT long cuSum8(long a, long b, long c, long d, long e, long f, long g, long h) {
	return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h;
}
EXPORT int cuScale(double x, int k, float y, double *out) {
	*out = x * k + y;
	return 0;
}
static int internal_function(int x) { return x * 3; }

static uint64_t table_data = 0x1234;
EXPORT const void *cuFakeDataAddress(void) { return &table_data; }
static int slot_a(int x) { return x + 1; }
static int slot_b(int *out) {
	*out = 42;
	return 0;
}
static int slot_c(void) { return 7; }
static long slot_d(long a, long b, long c, long d, long e, long f, long g) { return a + b + c + d + e + f + g * 100; }
static const uintptr_t table_header[4] = {4 * 8, (uintptr_t)slot_a, (uintptr_t)slot_b, (uintptr_t)&table_data};
static const uintptr_t table_plain[3] = {(uintptr_t)slot_c, (uintptr_t)slot_d, 0};

EXPORT int cuGetExportTable(const void **pp, const void *id) {
	const uint8_t *u = id;
	if (u[0] == 0xaa) *pp = table_header;
	else if (u[0] == 0xbb) *pp = table_plain;
	else return 500;
	return 0;
}

EXPORT int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);
EXPORT int cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
	return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
EXPORT int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
	void *fn = NULL;
	if (strcmp(symbol, "cuSum8") == 0) fn = (void *)cuSum8;
	if (strcmp(symbol, "cuInternal") == 0 && version >= 13000) fn = (void *)internal_function;
	if (strcmp(symbol, "cuGetExportTable") == 0) fn = (void *)cuGetExportTable;
	if (strcmp(symbol, "cuGetProcAddress") == 0) fn = (void *)cuGetProcAddress_v2;
	*pfn = fn;
	if (status != NULL) *status = fn != NULL ? 0 : 1;
	return fn != NULL ? 0 : 500;
}
