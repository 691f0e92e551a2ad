/*
 * test_trace.c: the trace library passes calls through unchanged (integer arguments on the stack, floating-point
 * arguments, private-table slots, functions resolved through cuGetProcAddress) and counts each exactly.
 * usage: test_trace TRACE_LIB DUMP_FILE   (FAAS_GPU_TRACE_REAL names the fake driver)
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond, ...)                                                                                               \
	do {                                                                                                           \
		if (!(cond)) {                                                                                         \
			failures++;                                                                                    \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                           \
			fprintf(stderr, __VA_ARGS__);                                                                  \
			fputc('\n', stderr);                                                                           \
		}                                                                                                      \
	} while (0)

typedef long (*sum8_fn)(long, long, long, long, long, long, long, long);
static sum8_fn sum8;

static void *hammer(void *arg) {
	for (int i = 0; i < 10000; i++)
		if (sum8(1, 1, 1, 1, 1, 1, 1, 1) != 36) abort();
	return arg;
}

static int has_line(const char *dump, const char *line) {
	char needle[512];
	snprintf(needle, sizeof needle, "\n%s\n", line);
	return strstr(dump, needle) != NULL;
}

int main(int argc, char **argv) {
	if (argc != 3) return 2;
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
		return 1;
	}
	int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
	CHECK(init != NULL && init(0) == 0 && init(5) == 1, "cuInit passes its argument through");
	sum8 = (sum8_fn)dlsym(lib, "cuSum8");
	CHECK(sum8 != NULL && sum8(1, 2, 3, 4, 5, 6, 7, 8) == 204, "eight integer arguments, two on the stack");
	int (*scale)(double, int, float, double *) = (int (*)(double, int, float, double *))dlsym(lib, "cuScale");
	double out = 0;
	CHECK(scale != NULL && scale(1.5, 4, 0.25f, &out) == 0 && out == 6.25, "floating-point arguments: %g", out);

	int (*getproc)(const char *, void **, int, unsigned long long, int *) =
	    (int (*)(const char *, void **, int, unsigned long long, int *))dlsym(lib, "cuGetProcAddress_v2");
	void *fn = NULL;
	int status = -1;
	CHECK(getproc("cuSum8", &fn, 13000, 0, &status) == 0 && status == 0, "resolve cuSum8");
	CHECK(fn != NULL && fn != (void *)sum8 && ((sum8_fn)fn)(1, 0, 0, 0, 0, 0, 0, 1) == 9, "resolved cuSum8 wrapped");
	CHECK(getproc("cuInternal", &fn, 13000, 0, &status) == 0 && ((int (*)(int))fn)(5) == 15, "an internal function");
	CHECK(getproc("cuInternal", &fn, 12000, 0, &status) == 500 && status == 1, "not found at 12000");
	CHECK(getproc("cuGetProcAddress", &fn, 13000, 0, &status) == 0 && fn == (void *)getproc,
	      "cuGetProcAddress resolves to the trace library's own");
	int (*table)(const void **, const void *) = NULL;
	CHECK(getproc("cuGetExportTable", (void **)&table, 13000, 0, &status) == 0 && table == dlsym(lib, "cuGetExportTable"),
	      "cuGetExportTable resolves to the trace library's own");

	uint8_t ida[16] = {0xaa, 1}, idb[16] = {0xbb, 2}, idc[16] = {0xcc};
	const uintptr_t *ta = NULL, *tb = NULL, *tc = NULL;
	CHECK(table((const void **)&ta, ida) == 0 && ta != NULL, "table with header");
	const void *(*data)(void) = (const void *(*)(void))dlsym(lib, "cuFakeDataAddress");
	CHECK(ta[0] == 32 && ta[3] == (uintptr_t)data(), "header and data word kept");
	CHECK(((int (*)(int))ta[1])(41) == 42, "slot 1");
	int v = 0;
	CHECK(((int (*)(int *))ta[2])(&v) == 0 && v == 42, "slot 2");
	CHECK(((int (*)(int *))ta[2])(&v) == 0, "slot 2 again");
	CHECK(table((const void **)&tb, idb) == 0 && ((int (*)(void))tb[0])() == 7, "table without header");
	CHECK(((long (*)(long, long, long, long, long, long, long))tb[1])(1, 1, 1, 1, 1, 1, 2) == 206, "slot with a stack argument");
	CHECK(tb[2] == 0, "the word after a headerless table's code is kept");
	CHECK(table((const void **)&tc, idc) == 500, "an unknown table's error is passed through");

	pthread_t th[4];
	for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, hammer, NULL);
	for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);

	int (*dump)(const char *) = (int (*)(const char *))dlsym(lib, "faas_gpu_trace_dump");
	CHECK(dump != NULL && dump(argv[2]) == 0, "dump");
	FILE *f = fopen(argv[2], "r");
	char buf[1 << 16] = "\n";
	size_t n = f != NULL ? fread(buf + 1, 1, sizeof buf - 2, f) : 0;
	buf[n + 1] = 0;
	if (f != NULL) fclose(f);
	const char *want[] = {
	    "export\tcuInit\t2",
	    "export\tcuSum8\t40001",
	    "export\tcuScale\t1",
	    "export\tcuFakeDataAddress\t1",
	    "proc\tcuSum8\t1",
	    "proc\tcuInternal\t1",
	    "slot\taa010000-0000-0000-0000-000000000000[1]\t1",
	    "slot\taa010000-0000-0000-0000-000000000000[2]\t2",
	    "slot\tbb020000-0000-0000-0000-000000000000[0]\t1",
	    "slot\tbb020000-0000-0000-0000-000000000000[1]\t1",
	    "resolve\tcuSum8\t13000\t0\t0\t0\tcuSum8\t1",
	    "resolve\tcuInternal\t13000\t0\t0\t0\t(internal)\t1",
	    "resolve\tcuInternal\t12000\t0\t500\t1\t-\t1",
	    "table\taa010000-0000-0000-0000-000000000000\theader\t4\t1",
	    "table\tbb020000-0000-0000-0000-000000000000\tnoheader\t2\t1",
	    "entry\tcuGetExportTable\t3",
	};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK(has_line(buf, want[i]), "dump has %s", want[i]);
	if (failures != 0) {
		fprintf(stderr, "dump:%s", buf);
		return 1;
	}
	printf("trace: all checks passed\n");
	return 0;
}
