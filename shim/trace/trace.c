/*
 * trace.c: the shim's trace mode, a libcuda.so.1 that passes every call through to the real NVIDIA driver and
 * records what a workload uses: every exported entry point called, every name resolved through cuGetProcAddress
 * (with the CUDA version and flags asked for, and the real function it resolved to), every private table asked for
 * through cuGetExportTable and every slot of those tables called, each with a call count.
 *
 * The GPU suite runs PyTorch under it (make gpu-trace) and checks the result in as a fixture that the CPU tests
 * compare the shim with. It is built on the GPU machine from the real driver's own export list (gen.sh), so that a
 * dlsym of any name answers as the real driver does.
 *
 * Environment:
 *   FAAS_GPU_TRACE_REAL     the real libcuda.so.1 (default: the one the library was generated from)
 *   FAAS_GPU_TRACE_OUT      where the counts are written at exit (default: not written)
 *   FAAS_GPU_TRACE_VERBOSE  1: log each first call, resolution and table to stderr
 * faas_gpu_trace_dump(path) writes the counts so far (a workload snapshots around one forward pass with ctypes).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "names.h"

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))

#ifndef TRACE_REAL_DEFAULT
#define TRACE_REAL_DEFAULT "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
#endif

enum { CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NOT_FOUND = 500 };
enum kind { KIND_EXPORT, KIND_PROC, KIND_SLOT };
static const char *const kind_names[] = {"export", "proc", "slot"};

/* One trampoline's state: the generated exports first (index < TRACE_NEXPORTS), then the pool. */
struct entry {
	_Atomic(void *) target;
	atomic_ullong count;
	enum kind kind;
	char label[128];
};

/* One cuGetProcAddress resolution: the name, version and flags asked for, and what the real driver answered. */
struct resolution {
	char symbol[96];
	int version;
	unsigned long long flags;
	int result, status;
	char real[96];
	unsigned long long count;
};

/* One private table handed out. */
struct table {
	uint8_t uuid[16];
	const void *orig;
	uintptr_t *wrapped;
	int header, slots;
	unsigned long long count;
};

enum { MAX_RESOLUTIONS = 16384, MAX_TABLES = 256, MAX_EXEC = 64, HASH = 32768 };

typedef int (*getproc_v2_fn)(const char *, void **, int, unsigned long long, int *);
typedef int (*getproc_fn)(const char *, void **, int, unsigned long long);
typedef int (*export_table_fn)(const void **, const void *);

static struct {
	pthread_once_t once;
	pthread_mutex_t mu;
	void *real;
	getproc_v2_fn getproc_v2;
	getproc_fn getproc;
	export_table_fn export_table;
	uintptr_t exec_lo[MAX_EXEC], exec_hi[MAX_EXEC];
	int nexec;
	int verbose;
	struct entry entries[TRACE_NEXPORTS + TRACE_POOL];
	int pool_used;
	int pool_full_logged;
	int pool_index[HASH]; /* open addressing over pool entries by (target, label); 0 empty, else index+1 */
	struct resolution resolutions[MAX_RESOLUTIONS];
	int nresolutions;
	struct table tables[MAX_TABLES];
	int ntables;
	atomic_ullong getproc_calls, export_table_calls;
} T = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER};

extern char trace_pool[];

static void vlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void vlog(const char *fmt, ...) {
	if (!T.verbose) return;
	va_list ap;
	va_start(ap, fmt);
	fputs("faas-gpu trace: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* exec_ranges records the executable mappings of the real driver, so that table slots are told from data. */
static void exec_ranges(void) {
	Dl_info info;
	if (T.getproc_v2 == NULL || dladdr((void *)T.getproc_v2, &info) == 0 || info.dli_fname == NULL) return;
	/* /proc/self/maps names the file itself; the driver is usually loaded through a symbolic link. */
	char real[4096];
	if (realpath(info.dli_fname, real) == NULL) snprintf(real, sizeof real, "%s", info.dli_fname);
	FILE *f = fopen("/proc/self/maps", "r");
	if (f == NULL) return;
	char line[4096];
	while (fgets(line, sizeof line, f) != NULL && T.nexec < MAX_EXEC) {
		unsigned long lo, hi;
		char perms[8], path[3072] = "";
		if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %3071s", &lo, &hi, perms, path) < 3) continue;
		if (strchr(perms, 'x') == NULL || strcmp(path, real) != 0) continue;
		T.exec_lo[T.nexec] = lo;
		T.exec_hi[T.nexec] = hi;
		T.nexec++;
	}
	fclose(f);
}

static int is_exec(uintptr_t p) {
	for (int i = 0; i < T.nexec; i++)
		if (p >= T.exec_lo[i] && p < T.exec_hi[i]) return 1;
	return 0;
}

static void init(void) {
	T.verbose = getenv("FAAS_GPU_TRACE_VERBOSE") != NULL && strcmp(getenv("FAAS_GPU_TRACE_VERBOSE"), "1") == 0;
	const char *path = getenv("FAAS_GPU_TRACE_REAL");
	if (path == NULL || *path == '\0') path = TRACE_REAL_DEFAULT;
	int flags = RTLD_NOW | RTLD_LOCAL;
	if (getenv("FAAS_GPU_TRACE_NO_DEEPBIND") == NULL) flags |= RTLD_DEEPBIND;
	T.real = dlopen(path, flags);
	if (T.real == NULL) {
		fprintf(stderr, "faas-gpu trace: cannot load the real driver %s: %s\n", path, dlerror());
		return;
	}
	T.getproc_v2 = (getproc_v2_fn)dlsym(T.real, "cuGetProcAddress_v2");
	T.getproc = (getproc_fn)dlsym(T.real, "cuGetProcAddress");
	T.export_table = (export_table_fn)dlsym(T.real, "cuGetExportTable");
	exec_ranges();
	vlog("passing through to %s (%d executable ranges)", path, T.nexec);
}

static int not_initialized(void) { return CUDA_ERROR_NOT_INITIALIZED; }

/* trace_hit is called by every trampoline (common.S): it counts the call and returns the function to enter. */
HIDDEN void *trace_hit(uint64_t idx) {
	pthread_once(&T.once, init);
	if (idx >= (uint64_t)(TRACE_NEXPORTS + TRACE_POOL)) return (void *)not_initialized;
	struct entry *e = &T.entries[idx];
	unsigned long long n = atomic_fetch_add(&e->count, 1);
	void *target = atomic_load(&e->target);
	if (target == NULL && idx < TRACE_NEXPORTS) {
		target = T.real != NULL ? dlsym(T.real, trace_export_names[idx]) : NULL;
		if (target == NULL) target = (void *)not_initialized;
		atomic_store(&e->target, target);
	}
	if (n == 0) vlog("first call: %s", idx < TRACE_NEXPORTS ? trace_export_names[idx] : e->label);
	return target != NULL ? target : (void *)not_initialized;
}

static uint64_t hash_of(const void *target, const char *label) {
	uint64_t h = 1469598103934665603ull ^ (uint64_t)(uintptr_t)target;
	for (const char *p = label; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
	return h;
}

/* wrap returns a pool trampoline that counts calls under label and enters target; the same (target, label) always
 * gets the same trampoline. Called with T.mu held. */
static void *wrap(enum kind kind, const char *label, void *target) {
	uint64_t h = hash_of(target, label);
	for (uint64_t probe = 0; probe < HASH; probe++) {
		int *slot = &T.pool_index[(h + probe) % HASH];
		if (*slot != 0) {
			struct entry *e = &T.entries[TRACE_NEXPORTS + *slot - 1];
			if (atomic_load(&e->target) == target && strcmp(e->label, label) == 0)
				return trace_pool + (size_t)(*slot - 1) * TRACE_POOL_STRIDE;
			continue;
		}
		if (T.pool_used == TRACE_POOL) break;
		int i = T.pool_used++;
		struct entry *e = &T.entries[TRACE_NEXPORTS + i];
		e->kind = kind;
		snprintf(e->label, sizeof e->label, "%s", label);
		atomic_store(&e->target, target);
		*slot = i + 1;
		return trace_pool + (size_t)i * TRACE_POOL_STRIDE;
	}
	if (!T.pool_full_logged) {
		T.pool_full_logged = 1;
		fprintf(stderr, "faas-gpu trace: trampoline pool full (%d): %s and later ones are not counted\n",
			TRACE_POOL, label);
	}
	return target;
}

static void record_resolution(const char *symbol, int version, unsigned long long flags, int result, int status,
			      void *fn) {
	for (int i = 0; i < T.nresolutions; i++) {
		struct resolution *r = &T.resolutions[i];
		if (r->version == version && r->flags == flags && strcmp(r->symbol, symbol) == 0) {
			r->count++;
			return;
		}
	}
	if (T.nresolutions == MAX_RESOLUTIONS) return;
	struct resolution *r = &T.resolutions[T.nresolutions++];
	snprintf(r->symbol, sizeof r->symbol, "%s", symbol);
	r->version = version;
	r->flags = flags;
	r->result = result;
	r->status = status;
	r->count = 1;
	Dl_info info;
	if (fn != NULL && dladdr(fn, &info) != 0 && info.dli_sname != NULL && info.dli_saddr == fn)
		snprintf(r->real, sizeof r->real, "%s", info.dli_sname);
	else
		snprintf(r->real, sizeof r->real, "%s", fn != NULL ? "(internal)" : "-");
	vlog("resolve %s (CUDA %d, flags %llu): result %d status %d -> %s", symbol, version, flags, result, status,
	     r->real);
}

EXPORT int cuGetExportTable(const void **ppExportTable, const void *pExportTableId);
EXPORT int cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags,
			       int *symbolStatus);
EXPORT int cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags);

/* redirect keeps the three entry points the trace library implements itself, and wraps every other function. */
static void *redirect(const char *symbol, void *fn) {
	if (fn == (void *)T.getproc_v2) return (void *)cuGetProcAddress_v2;
	if (fn == (void *)T.getproc) return (void *)cuGetProcAddress;
	if (fn == (void *)T.export_table) return (void *)cuGetExportTable;
	return wrap(KIND_PROC, symbol, fn);
}

EXPORT int cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags,
			       int *symbolStatus) {
	pthread_once(&T.once, init);
	atomic_fetch_add(&T.getproc_calls, 1);
	if (T.getproc_v2 == NULL) return CUDA_ERROR_NOT_INITIALIZED;
	int status = -1;
	int r = T.getproc_v2(symbol, pfn, cudaVersion, flags, &status);
	if (symbolStatus != NULL) *symbolStatus = status;
	if (symbol == NULL || pfn == NULL) return r;
	void *fn = r == 0 ? *pfn : NULL;
	pthread_mutex_lock(&T.mu);
	record_resolution(symbol, cudaVersion, flags, r, status, fn);
	if (fn != NULL) *pfn = redirect(symbol, fn);
	pthread_mutex_unlock(&T.mu);
	return r;
}

EXPORT int cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags) {
	pthread_once(&T.once, init);
	atomic_fetch_add(&T.getproc_calls, 1);
	if (T.getproc == NULL) return CUDA_ERROR_NOT_INITIALIZED;
	int r = T.getproc(symbol, pfn, cudaVersion, flags);
	if (symbol == NULL || pfn == NULL) return r;
	void *fn = r == 0 ? *pfn : NULL;
	pthread_mutex_lock(&T.mu);
	record_resolution(symbol, cudaVersion, flags, r, -1, fn);
	if (fn != NULL) *pfn = redirect(symbol, fn);
	pthread_mutex_unlock(&T.mu);
	return r;
}

static void uuid_string(const uint8_t *u, char *out, size_t n) {
	snprintf(out, n, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3],
		 u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* Tables whose own addresses enter the runtime's integrity check (the hash covers the CUDART_INTERFACE table, the
 * INTEGRITY_CHECK table and its slot function): handed out unchanged, so their slots are not counted. */
static const uint8_t unwrapped[][16] = {
    {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9},
    {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2},
};

/* wrap_table copies a private table with each function slot replaced by a counting trampoline. A table whose first
 * word is a small multiple of 8 has a byte-size header (kept as it is); one without runs as long as its words point
 * into the driver's code. Called with T.mu held. */
static const void *wrap_table(const uint8_t *uuid, const void *orig) {
	for (int i = 0; i < T.ntables; i++)
		if (memcmp(T.tables[i].uuid, uuid, 16) == 0 && T.tables[i].orig == orig) {
			T.tables[i].count++;
			return T.tables[i].wrapped != NULL ? T.tables[i].wrapped : orig;
		}
	if (T.ntables == MAX_TABLES) return orig;
	struct table *t = &T.tables[T.ntables++];
	memcpy(t->uuid, uuid, 16);
	t->orig = orig;
	t->count = 1;
	const uintptr_t *words = orig;
	int header = words[0] >= 16 && words[0] <= 8192 && words[0] % 8 == 0;
	int n = 0;
	if (header)
		n = (int)(words[0] / 8);
	else
		while (n < 1024 && is_exec(words[n])) n++;
	t->header = header;
	t->slots = n;
	char id[40];
	uuid_string(uuid, id, sizeof id);
	vlog("table %s: %s, %d words", id, header ? "size header" : "no header", n);
	if (n == 0) return orig;
	for (size_t i = 0; i < sizeof unwrapped / sizeof unwrapped[0]; i++)
		if (memcmp(uuid, unwrapped[i], 16) == 0) return orig;
	t->wrapped = calloc((size_t)n, sizeof *t->wrapped);
	if (t->wrapped == NULL) return orig;
	for (int i = 0; i < n; i++) {
		t->wrapped[i] = words[i];
		if ((header && i == 0) || !is_exec(words[i])) continue;
		char label[64];
		snprintf(label, sizeof label, "%s[%d]", id, i);
		t->wrapped[i] = (uintptr_t)wrap(KIND_SLOT, label, (void *)words[i]);
	}
	return t->wrapped;
}

EXPORT int cuGetExportTable(const void **ppExportTable, const void *pExportTableId) {
	pthread_once(&T.once, init);
	atomic_fetch_add(&T.export_table_calls, 1);
	if (T.export_table == NULL) return CUDA_ERROR_NOT_INITIALIZED;
	int r = T.export_table(ppExportTable, pExportTableId);
	if (r != 0 || ppExportTable == NULL || *ppExportTable == NULL || pExportTableId == NULL) {
		if (pExportTableId != NULL) {
			char id[40];
			uuid_string(pExportTableId, id, sizeof id);
			vlog("table %s: result %d", id, r);
		}
		return r;
	}
	pthread_mutex_lock(&T.mu);
	*ppExportTable = wrap_table(pExportTableId, *ppExportTable);
	pthread_mutex_unlock(&T.mu);
	return r;
}

/* faas_gpu_trace_dump writes what was recorded so far, one tab-separated line each:
 *   export <name> <calls>                      an exported entry point called directly (dlsym or linking)
 *   proc <name> <calls>                        a function resolved through cuGetProcAddress, called
 *   slot <uuid>[<i>] <calls>                   a private-table slot called
 *   resolve <name> <version> <flags> <result> <status> <real function> <times resolved>
 *   table <uuid> <header|noheader> <words> <times asked for> [unwrapped]
 *   entry cuGetProcAddress|cuGetExportTable <calls>
 * Returns 0, or -1 if the file cannot be written. */
EXPORT int faas_gpu_trace_dump(const char *path) {
	FILE *f = fopen(path, "w");
	if (f == NULL) return -1;
	pthread_mutex_lock(&T.mu);
	for (int i = 0; i < TRACE_NEXPORTS; i++) {
		unsigned long long n = atomic_load(&T.entries[i].count);
		if (n != 0) fprintf(f, "export\t%s\t%llu\n", trace_export_names[i], n);
	}
	for (int i = 0; i < T.pool_used; i++) {
		struct entry *e = &T.entries[TRACE_NEXPORTS + i];
		unsigned long long n = atomic_load(&e->count);
		if (n != 0) fprintf(f, "%s\t%s\t%llu\n", kind_names[e->kind], e->label, n);
	}
	for (int i = 0; i < T.nresolutions; i++) {
		struct resolution *r = &T.resolutions[i];
		fprintf(f, "resolve\t%s\t%d\t%llu\t%d\t%d\t%s\t%llu\n", r->symbol, r->version, r->flags, r->result,
			r->status, r->real, r->count);
	}
	for (int i = 0; i < T.ntables; i++) {
		char id[40];
		uuid_string(T.tables[i].uuid, id, sizeof id);
		fprintf(f, "table\t%s\t%s\t%d\t%llu%s\n", id, T.tables[i].header ? "header" : "noheader",
			T.tables[i].slots, T.tables[i].count, T.tables[i].wrapped == NULL ? "\tunwrapped" : "");
	}
	fprintf(f, "entry\tcuGetProcAddress\t%llu\n", atomic_load(&T.getproc_calls));
	fprintf(f, "entry\tcuGetExportTable\t%llu\n", atomic_load(&T.export_table_calls));
	pthread_mutex_unlock(&T.mu);
	return fclose(f) == 0 ? 0 : -1;
}

__attribute__((destructor)) static void dump_at_exit(void) {
	const char *path = getenv("FAAS_GPU_TRACE_OUT");
	if (path != NULL && *path != '\0' && faas_gpu_trace_dump(path) != 0)
		fprintf(stderr, "faas-gpu trace: cannot write %s\n", path);
}
