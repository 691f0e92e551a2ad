/*
 * test_shim.c: C tests of the shim against an in-process stand-in for the gpuserver's transport (a thread that
 * speaks the hello, reads call records from the ring and answers sync calls). The records the shim writes are
 * compared byte for byte with ../testdata/records.golden, which the gpuserver's Go tests decode: together they pin
 * the record layout on both sides. Run with SHIM_UPDATE_GOLDEN=1 to rewrite the golden file after a deliberate
 * wire-format change (and bump the version).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shim.h"

int cuInit(unsigned);
int cuDriverGetVersion(int *);
int cuGetErrorName(int, const char **);
int cuGetErrorString(int, const char **);
int cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
int cuGetExportTable(const void **, const void *);
int cuDeviceGetCount(int *);
int cuDeviceGetName(char *, int, int);
int cuDeviceTotalMem_v2(size_t *, int);
int cuDeviceGetAttribute(int *, int, int);
int cuDeviceGetUuid_v2(void *, int);
int cuDevicePrimaryCtxRetain(void **, int);
int cuCtxSetCurrent(void *);
int cuCtxGetCurrent(void **);
int cuMemAlloc_v2(unsigned long long *, size_t);
int cuMemAlloc(unsigned long long *, size_t);
int cuMemcpyHtoD_v2(unsigned long long, const void *, size_t);
int cuMemcpyDtoH_v2(void *, unsigned long long, size_t);
int cuMemsetD32_v2(unsigned long long, unsigned, size_t);
int cuModuleLoadData(void **, const void *);
int cuModuleGetFunction(void **, void *, const char *);
int cuFuncGetParamInfo(void *, size_t, size_t *, size_t *);
int cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
		   void **);
int cuCtxSynchronize(void);
int cuStreamSynchronize(void *);
int cuStreamQuery(void *);
int cuStreamCreate(void **, unsigned);
int cuMemcpyDtoHAsync_v2(void *, unsigned long long, size_t, void *);
int cuGraphCreate(void *, unsigned);

static void test_device_slots(void);

static int failures;
#define CHECK(cond, ...)                                                                                              \
	do {                                                                                                           \
		if (!(cond)) {                                                                                         \
			failures++;                                                                                    \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                \
			fprintf(stderr, __VA_ARGS__);                                                                  \
			fprintf(stderr, "\n");                                                                         \
		}                                                                                                      \
	} while (0)

/* ---- the stand-in server */

#define VA_BASE 0x7f0000000000ull
#define MAX_RECORDS 64

static struct {
	int refuse_status; /* answer the hello with this status (0: accept) */
	int lfd;
	char path[108];
	uint8_t *shm;
	size_t shm_size;
	int cfd;
	volatile int stop;
	/* records seen (only the first MAX_RECORDS kept) */
	uint8_t *rec[MAX_RECORDS];
	size_t rec_len[MAX_RECORDS];
	int nrec;
	/* bulk copies */
	uint64_t htod_bytes, htod_sum;
	/* records per call id; an async call that fails (the next record of fail_id answers fail_result at the
	 * next syncpoint, as the gpuserver does) */
	int calls[512];
	unsigned fail_id;
	int fail_result, pending;
} srv;

/* The stand-in's stream handle (cuStreamCreate). */
#define STREAM_HANDLE 0x33

static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

static uint8_t pattern(uint64_t addr) { return (uint8_t)(addr * 7 + 3); }

static void respond(uint64_t seq, int result, const uint8_t *payload, uint32_t len) {
	uint8_t *resp = srv.shm + rd64(srv.shm + SHIM_CTL_RESP_OFFSET);
	memcpy(resp, &seq, 8);
	memcpy(resp + 8, &result, 4);
	memcpy(resp + 12, &len, 4);
	if (len) memcpy(resp + SHIM_RESPONSE_HEADER_SIZE, payload, len);
	__atomic_store_n((uint64_t *)(srv.shm + SHIM_CTL_RESP_SEQ), seq, __ATOMIC_SEQ_CST);
	if (__atomic_load_n((uint32_t *)(srv.shm + SHIM_CTL_CLIENT_WAITING), __ATOMIC_SEQ_CST)) {
		char b = 1;
		if (write(srv.cfd, &b, 1) < 0) perror("doorbell");
	}
}

static void handle(const uint8_t *rec, size_t size) {
	uint16_t id, flags;
	memcpy(&id, rec + 4, 2);
	memcpy(&flags, rec + 6, 2);
	uint64_t seq = rd64(rec + 8);
	const uint8_t *p = rec + SHIM_RECORD_HEADER_SIZE;
	if (srv.nrec < MAX_RECORDS && (id != CALL_memcpyHtoDChunk && size < 4096)) {
		srv.rec[srv.nrec] = malloc(size);
		memcpy(srv.rec[srv.nrec], rec, size);
		srv.rec_len[srv.nrec++] = size;
	}
	static uint8_t out[8 << 20];
	uint32_t len = 0;
	int result = 0;
	if (id < 512) srv.calls[id]++;
	if (srv.fail_id != 0 && id == srv.fail_id) {
		srv.fail_id = 0;
		if (!(flags & SHIM_RECORD_FLAG_SYNC)) {
			if (srv.pending == 0) srv.pending = srv.fail_result;
			return;
		}
		respond(seq, srv.fail_result, NULL, 0);
		return;
	}
	switch (id) {
	case CALL_cuCtxSynchronize:
	case CALL_cuStreamSynchronize:
	case CALL_cuStreamQuery:
	case CALL_cuMemcpyDtoH_v2:
	case CALL_cuMemcpyDtoHAsync_v2:
		if (id == CALL_cuStreamSynchronize || id == CALL_cuStreamQuery) {
			uint64_t h = rd64(p);
			if (h > 2 && h != STREAM_HANDLE) result = CUDA_ERROR_INVALID_HANDLE;
		}
		if (result == 0 && srv.pending != 0) { /* a syncpoint reports the first error of earlier async calls */
			result = srv.pending;
			srv.pending = 0;
		}
		if (result != 0) {
			respond(seq, result, NULL, 0);
			return;
		}
		break;
	}
	switch (id) {
	case CALL_cuStreamCreate: {
		uint64_t h = STREAM_HANDLE;
		memcpy(out, &h, 8);
		len = 8;
		break;
	}
	case CALL_cuMemAlloc_v2: {
		uint64_t a = VA_BASE + 0x1000;
		memcpy(out, &a, 8);
		len = 8;
		break;
	}
	case CALL_memcpyHtoDChunk:
	case CALL_cuMemcpyHtoD_v2: {
		uint64_t n = rd64(p + 8);
		for (uint64_t i = 0; i < n; i++) srv.htod_sum += p[16 + i];
		srv.htod_bytes += n;
		break;
	}
	case CALL_cuMemcpyDtoH_v2:
	case CALL_cuMemcpyDtoHAsync_v2: {
		uint64_t cap = rd64(p), src = rd64(p + 8);
		memcpy(out, &cap, 8);
		for (uint64_t i = 0; i < cap; i++) out[8 + i] = pattern(src + i);
		len = 8 + (uint32_t)((cap + 7) & ~7ull);
		break;
	}
	case CALL_cuModuleLoadData: {
		uint64_t h = 0x11;
		memcpy(out, &h, 8);
		len = 8;
		break;
	}
	case CALL_cuModuleGetFunction: {
		/* hfunc, then params: 3 parameters at 0 (8 bytes), 8 (8 bytes), 16 (4 bytes) */
		uint64_t h = 0x22, cap = 1028;
		memcpy(out, &h, 8);
		memcpy(out + 8, &cap, 8);
		memset(out + 16, 0, 1032);
		uint32_t layout[] = {3, 0, 8, 8, 8, 16, 4};
		memcpy(out + 16, layout, sizeof layout);
		len = 16 + 1032;
		break;
	}
	}
	if (flags & SHIM_RECORD_FLAG_SYNC) respond(seq, result, out, len);
}

static void *serve(void *arg) {
	(void)arg;
	srv.cfd = accept(srv.lfd, NULL, NULL);
	if (srv.cfd < 0) return NULL;
	uint8_t hello[SHIM_HELLO_SIZE];
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = hello, .iov_len = sizeof hello};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	if (recvmsg(srv.cfd, &msg, 0) != (ssize_t)sizeof hello) return NULL;
	int mfd;
	memcpy(&mfd, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof mfd);
	srv.shm_size = rd64(hello + SHIM_HELLO_SHM_SIZE);
	srv.shm = mmap(NULL, srv.shm_size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	close(mfd);
	uint8_t reply[SHIM_REPLY_SIZE];
	memset(reply, 0, sizeof reply);
	uint32_t magic = SHIM_MAGIC;
	uint16_t major = SHIM_VERSION_MAJOR, minor = SHIM_VERSION_MINOR;
	int32_t status = srv.refuse_status;
	uint64_t total = 1ull << 30, base = VA_BASE, vsize = 1ull << 40;
	memcpy(reply, &magic, 4);
	memcpy(reply + 4, &major, 2);
	memcpy(reply + 6, &minor, 2);
	memcpy(reply + SHIM_REPLY_STATUS, &status, 4);
	memcpy(reply + SHIM_REPLY_TOTAL_MEM, &total, 8);
	memcpy(reply + SHIM_REPLY_VABASE, &base, 8);
	memcpy(reply + SHIM_REPLY_VASIZE, &vsize, 8);
	strcpy((char *)reply + SHIM_REPLY_DEVICE_NAME, "stand-in device");
	int32_t cc[2] = {9, 0};
	memcpy(reply + SHIM_REPLY_ATTRS + 75 * 4, cc, 8);
	if (status != 0) strcpy((char *)reply + SHIM_REPLY_MESSAGE, "protocol version 1.0 refused by the stand-in");
	if (write(srv.cfd, reply, sizeof reply) != (ssize_t)sizeof reply) return NULL;
	if (status != 0) {
		close(srv.cfd);
		return NULL;
	}
	uint8_t *ring = srv.shm + rd64(srv.shm + SHIM_CTL_RING_OFFSET);
	uint64_t ring_size = rd64(srv.shm + SHIM_CTL_RING_SIZE);
	uint64_t head = 0;
	while (!srv.stop) {
		uint64_t tail = __atomic_load_n((uint64_t *)(srv.shm + SHIM_CTL_REQ_TAIL), __ATOMIC_ACQUIRE);
		if (head == tail) {
			usleep(20);
			continue;
		}
		while (head < tail) {
			const uint8_t *rec = ring + head % ring_size;
			uint32_t size = rd32(rec);
			uint16_t id;
			memcpy(&id, rec + 4, 2);
			if (id != SHIM_RECORD_PAD_ID) handle(rec, size);
			head += size;
		}
		__atomic_store_n((uint64_t *)(srv.shm + SHIM_CTL_REQ_HEAD), head, __ATOMIC_RELEASE);
	}
	return NULL;
}

static pthread_t start_server(int refuse_status) {
	memset(&srv, 0, sizeof srv);
	srv.refuse_status = refuse_status;
	snprintf(srv.path, sizeof srv.path, "/tmp/faas-gpu-shim-test-%d-%d.sock", getpid(), refuse_status);
	unlink(srv.path);
	srv.lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	strcpy(a.sun_path, srv.path);
	if (bind(srv.lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(srv.lfd, 1) != 0) {
		perror("listen");
		exit(2);
	}
	setenv("FAAS_GPU_REMOTING_SOCKET", srv.path, 1);
	setenv("FAAS_GPU_FUNCTION", "test-fn", 1);
	setenv("FAAS_GPU_TOKEN", "test-token", 1);
	pthread_t t;
	pthread_create(&t, NULL, serve, NULL);
	return t;
}

/* ---- tests */

static void test_local(void) {
	int v = 0;
	CHECK(cuDriverGetVersion(&v) == 0 && v >= 12000, "driver version %d", v);
	const char *s = NULL;
	CHECK(cuGetErrorName(801, &s) == 0 && strcmp(s, "CUDA_ERROR_NOT_SUPPORTED") == 0, "error name %s", s);
	CHECK(cuGetErrorString(2, &s) == 0 && strcmp(s, "out of memory") == 0, "error string %s", s);
	CHECK(cuGetErrorName(12345, &s) == 1, "unknown error code accepted");

	/* A cubin's size: ptxas writes the program headers after the section headers, and the driver needs them. */
	static uint8_t elf[512];
	memset(elf, 0, sizeof elf);
	memcpy(elf, "\x7f" "ELF\x02", 5);
	uint64_t phoff = 300, shoff = 100;
	uint16_t phentsize = 56, phnum = 1, shentsize = 64, shnum = 2;
	memcpy(elf + 0x20, &phoff, 8), memcpy(elf + 0x28, &shoff, 8), memcpy(elf + 0x36, &phentsize, 2);
	memcpy(elf + 0x38, &phnum, 2), memcpy(elf + 0x3A, &shentsize, 2), memcpy(elf + 0x3C, &shnum, 2);
	const void *start;
	CHECK(shim_image_size(elf, &start) == 356 && start == elf, "cubin size %zu, want 356",
	      shim_image_size(elf, &start));
	uint64_t off = 400, size = 50; /* a section whose data ends last */
	uint32_t progbits = 1;
	memcpy(elf + 164 + 0x04, &progbits, 4), memcpy(elf + 164 + 0x18, &off, 8), memcpy(elf + 164 + 0x20, &size, 8);
	CHECK(shim_image_size(elf, &start) == 450, "cubin size %zu, want 450", shim_image_size(elf, &start));

}

/* Entry-point discovery: every variant of every entry resolves at its own version, with the per-thread flag for
 * its per-thread variants, and the versions pick the variant the driver picks. */
static void test_procaddr(void) {
	void *fn = NULL;
	int status = -1;
	for (size_t i = 0; i < shim_nentries; i++) {
		const struct shim_entry *e = &shim_entries[i];
		for (unsigned j = e->first; j < e->first + e->count; j++) {
			const struct shim_variant *v = &shim_variants[j];
			CHECK(cuGetProcAddress_v2(e->base, &fn, v->version, v->per_thread ? 2 : 0, &status) == 0 &&
				  fn == v->fn && status == 0,
			      "%s at %d%s does not resolve to %s", e->base, v->version, v->per_thread ? " per-thread" : "",
			      v->symbol);
		}
		CHECK(i == 0 || strcmp(shim_entries[i - 1].base, e->base) < 0, "entries not sorted at %s", e->base);
	}
	struct {
		const char *base;
		int version;
		int flags;
		const char *symbol;
	} cases[] = {
		{"cuCtxCreate", 13000, 0, "cuCtxCreate_v4"},   {"cuCtxCreate", 12000, 0, "cuCtxCreate_v3"},
		{"cuCtxCreate", 3020, 0, "cuCtxCreate_v2"},    {"cuCtxCreate", 2000, 0, "cuCtxCreate"},
		{"cuCtxGetDevice", 13000, 0, "cuCtxGetDevice_v2"}, {"cuCtxGetDevice", 12080, 0, "cuCtxGetDevice"},
		{"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2"},
		{"cuMemPrefetchAsync", 12020, 0, "cuMemPrefetchAsync_v2"},
		{"cuMemPrefetchAsync", 12010, 0, "cuMemPrefetchAsync"},
		{"cuMemPrefetchAsync", 12020, 2, "cuMemPrefetchAsync_v2_ptsz"},
		{"cuMemcpyHtoD", 13000, 2, "cuMemcpyHtoD_v2_ptds"}, {"cuMemcpyHtoD", 13000, 0, "cuMemcpyHtoD_v2"},
		{"cuMemAlloc", 13000, 0, "cuMemAlloc_v2"},      {"cuLaunchKernel", 12000, 2, "cuLaunchKernel_ptsz"},
		{"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
		{"cuStreamGetCaptureInfo", 13000, 0, "cuStreamGetCaptureInfo_v3"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		void *want = shim_symbol(cases[i].symbol);
		CHECK(cuGetProcAddress_v2(cases[i].base, &fn, cases[i].version, cases[i].flags, &status) == 0 &&
			  fn == want && want != NULL,
		      "%s at %d flags %d: want %s", cases[i].base, cases[i].version, cases[i].flags, cases[i].symbol);
	}
	/* Per-thread variants of implemented functions share the implementation. */
	CHECK(shim_symbol("cuMemcpyHtoD_v2_ptds") == shim_symbol("cuMemcpyHtoD_v2"), "ptds alias");
	CHECK(cuGetProcAddress_v2("cuMemAllocAsync", &fn, 11000, 0, &status) == 500 && fn == NULL && status == 2,
	      "a version before the function existed: CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT (%d)", status);
	CHECK(cuGetProcAddress_v2("cuNoSuchFunction", &fn, 12000, 0, &status) == 500 && fn == NULL && status == 1,
	      "unknown symbol: CUDA_ERROR_NOT_FOUND");
	CHECK(cuGetProcAddress_v2("cuGraphCreate", &fn, 12000, 0, NULL) == 0 && fn == (void *)cuGraphCreate,
	      "unsupported entry points are discoverable");
	uint64_t before = shim_stats.unsupported;
	CHECK(cuGraphCreate(NULL, 0) == 801, "unsupported call returns CUDA_ERROR_NOT_SUPPORTED");
	CHECK(cuGraphCreate(NULL, 0) == 801, "unsupported call returns CUDA_ERROR_NOT_SUPPORTED twice");
	CHECK(shim_stats.unsupported == before + 2, "unsupported calls are counted");
	/* Every exported symbol is in the proc table, which is sorted. */
	for (size_t i = 0; i < shim_nprocs; i++)
		CHECK(i == 0 || strcmp(shim_procs[i - 1].name, shim_procs[i].name) < 0, "proc table not sorted at %s",
		      shim_procs[i].name);
}

/* in_child runs f in a child process (the shim's connection state is per process) and returns its exit code. */
static int in_child(int (*f)(void)) {
	pid_t pid = fork();
	if (pid == 0) _exit(f());
	int st;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 255;
}

static int no_socket(void) {
	unsetenv("FAAS_GPU_REMOTING_SOCKET");
	int r1 = cuInit(0);
	unsigned long long p;
	int r2 = cuMemAlloc_v2(&p, 16);
	return r1 == 100 && r2 == 100 ? 0 : 1;
}

static int version_refused(void) {
	pthread_t t = start_server(SHIM_STATUS_VERSION);
	int r = cuInit(0);
	pthread_join(t, NULL);
	unlink(srv.path);
	return r == 803 ? 0 : 1;
}

static void test_refusals(void) {
	CHECK(in_child(no_socket) == 0, "without FAAS_GPU_REMOTING_SOCKET cuInit and calls return CUDA_ERROR_NO_DEVICE");
	CHECK(in_child(version_refused) == 0, "a refused version makes cuInit return CUDA_ERROR_SYSTEM_DRIVER_MISMATCH");
}

static const char ptx[] = "//\n.version 8.0\n.target sm_90\n.address_size 64\n";

static void hex(char *dst, const uint8_t *p, size_t n) {
	for (size_t i = 0; i < n; i++) sprintf(dst + 2 * i, "%02x", p[i]);
}

static void test_records(void) {
	pthread_t t = start_server(0);
	CHECK(cuInit(0) == 0, "cuInit");
	int n = 0;
	char name[64] = "";
	size_t total = 0;
	int cc = 0;
	CHECK(cuDeviceGetCount(&n) == 0 && n == 1, "one device, got %d", n);
	CHECK(cuDeviceGetName(name, sizeof name, 0) == 0 && strcmp(name, "stand-in device") == 0, "name %s", name);
	CHECK(cuDeviceTotalMem_v2(&total, 0) == 0 && total == 1ull << 30, "total memory is the quota: %zu", total);
	CHECK(cuDeviceGetAttribute(&cc, 75, 0) == 0 && cc == 9, "compute capability major %d", cc);
	CHECK(cuDeviceGetAttribute(&cc, 75, 1) == 101, "device 1 does not exist");
	void *ctx = NULL, *cur = NULL;
	CHECK(cuDevicePrimaryCtxRetain(&ctx, 0) == 0 && ctx != NULL, "primary context");
	CHECK(cuCtxSetCurrent(ctx) == 0 && cuCtxGetCurrent(&cur) == 0 && cur == ctx, "current context");
	test_device_slots();

	/* The golden sequence: every record below is compared with ../testdata/records.golden. */
	unsigned long long p = 0;
	CHECK(cuMemAlloc_v2(&p, 4096) == 0 && p == VA_BASE + 0x1000, "alloc %llx", p);
	CHECK(cuMemcpyHtoD_v2(p, "hello", 5) == 0, "htod");
	CHECK(cuMemsetD32_v2(p, 0xdeadbeef, 4) == 0, "memset");
	void *mod = NULL, *f = NULL;
	CHECK(cuModuleLoadData(&mod, ptx) == 0 && mod == (void *)0x11, "module %p", mod);
	CHECK(cuModuleGetFunction(&f, mod, "vector_add") == 0 && f == (void *)0x22, "function %p", f);
	size_t off = 0, size = 0;
	CHECK(cuFuncGetParamInfo(f, 2, &off, &size) == 0 && off == 16 && size == 4, "param 2 at %zu size %zu", off,
	      size);
	CHECK(cuFuncGetParamInfo(f, 3, &off, &size) == 1, "param 3 does not exist");
	unsigned long long a = 0x7f0000001000ull, b = 0x7f0000002000ull;
	unsigned cnt = 1000;
	void *params[] = {&a, &b, &cnt};
	CHECK(cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, NULL, params, NULL) == 0, "launch");
	CHECK(cuCtxSynchronize() == 0, "synchronize");
	uint8_t buf[16];
	CHECK(cuMemcpyDtoH_v2(buf, p, sizeof buf) == 0, "dtoh");
	for (size_t i = 0; i < sizeof buf; i++) CHECK(buf[i] == pattern(p + i), "dtoh byte %zu", i);
	int nrec = srv.nrec;

	/* Big copies are chunked through the ring and come back intact. */
	size_t big = 5u << 20;
	uint8_t *data = malloc(big), *back = malloc(big);
	uint64_t sum = 0;
	for (size_t i = 0; i < big; i++) sum += data[i] = (uint8_t)(i * 31);
	srv.htod_bytes = srv.htod_sum = 0;
	CHECK(cuMemcpyHtoD_v2(p, data, big) == 0, "big htod");
	CHECK(srv.htod_bytes == big && srv.htod_sum == sum, "big htod arrived: %llu bytes",
	      (unsigned long long)srv.htod_bytes);
	CHECK(cuMemcpyDtoH_v2(back, p + 1, big) == 0, "big dtoh");
	int bad = 0;
	for (size_t i = 0; i < big; i++) bad += back[i] != pattern(p + 1 + i);
	CHECK(bad == 0, "big dtoh: %d bytes differ", bad);
	free(data);
	free(back);

	/* Compare with, or rewrite, the golden records. */
	const char *golden = "../testdata/records.golden";
	if (getenv("SHIM_UPDATE_GOLDEN") != NULL) {
		FILE *w = fopen(golden, "w");
		fprintf(w, "# Call records written by the shim (shim/test/test_shim.c) and decoded by the gpuserver\n"
			   "# (gpuserver/remoting/golden_test.go): one record per line, in call order, as hex.\n");
		for (int i = 0; i < nrec; i++) {
			char h[8192];
			hex(h, srv.rec[i], srv.rec_len[i]);
			uint16_t id;
			memcpy(&id, srv.rec[i] + 4, 2);
			fprintf(w, "%s %s\n", shim_call_name(id), h);
		}
		fclose(w);
		printf("rewrote %s\n", golden);
	} else {
		FILE *r = fopen(golden, "r");
		CHECK(r != NULL, "open %s", golden);
		char line[16384];
		int i = 0;
		while (r != NULL && fgets(line, sizeof line, r) != NULL) {
			if (line[0] == '#') continue;
			line[strcspn(line, "\n")] = 0;
			char *sp = strchr(line, ' ');
			CHECK(sp != NULL && i < nrec, "golden line %d", i);
			if (sp == NULL || i >= nrec) break;
			char h[8192];
			hex(h, srv.rec[i], srv.rec_len[i]);
			uint16_t id;
			memcpy(&id, srv.rec[i] + 4, 2);
			CHECK(strncmp(line, shim_call_name(id), (size_t)(sp - line)) == 0 && strcmp(sp + 1, h) == 0,
			      "record %d differs from the golden file:\n  want %s\n  got  %s %s", i, line,
			      shim_call_name(id), h);
			i++;
		}
		CHECK(i == nrec, "golden file has %d records, the shim wrote %d", i, nrec);
		if (r) fclose(r);
	}
	srv.stop = 1;
	pthread_join(t, NULL);
	unlink(srv.path);
}

/* ---- synchronizations answered in the shim: a synchronize after a completed read with nothing sent since costs
 * no round trip; anything sent since, a failed read, an unknown stream or a capture sends it to the server. Runs in
 * a child (a connection of its own) and returns its failures. */

static int failures_before;

static int server_syncs(void) {
	return srv.calls[CALL_cuStreamSynchronize] + srv.calls[CALL_cuCtxSynchronize] + srv.calls[CALL_cuStreamQuery];
}

/* sync_is checks that f answered want, and whether it reached the server. */
#define SYNC_IS(f, want, remote, ...)                                                                                \
	do {                                                                                                           \
		int before = server_syncs();                                                                           \
		uint64_t answered = shim_stats.syncs_answered, sync_calls = shim_stats.sync_calls;                     \
		int r_ = (f);                                                                                          \
		int went = server_syncs() - before;                                                                    \
		CHECK(r_ == (want), "%s answered %d, want %d: " __VA_ARGS__, #f, r_, want);                           \
		CHECK(went == (remote), "%s reached the server %d times, want %d: " __VA_ARGS__, #f, went, remote);    \
		CHECK(shim_stats.syncs_answered - answered == (uint64_t)!(remote) &&                                  \
			      shim_stats.sync_calls - sync_calls == (uint64_t)(remote),                                \
		      "%s: counters: answered +%llu, sync calls +%llu: " __VA_ARGS__, #f,                                   \
		      (unsigned long long)(shim_stats.syncs_answered - answered),                                      \
		      (unsigned long long)(shim_stats.sync_calls - sync_calls));                                       \
	} while (0)

static int sync_answers(void) {
	failures_before = failures;
	pthread_t t = start_server(0);
	CHECK(cuInit(0) == 0, "cuInit");
	unsigned long long p = 0;
	void *s = NULL;
	uint8_t buf[16];
	CHECK(cuMemAlloc_v2(&p, 4096) == 0, "alloc");
	CHECK(cuStreamCreate(&s, 0) == 0 && s == (void *)STREAM_HANDLE, "stream %p", s);

	/* Before any read: the synchronize goes to the server. */
	SYNC_IS(cuStreamSynchronize(s), 0, 1, "nothing read yet");

	/* The decode step: async work, a read of its result, the synchronize PyTorch makes after the read. */
	CHECK(cuMemsetD32Async(p, 7, 4, s) == 0, "memset");
	CHECK(cuMemcpyDtoHAsync_v2(buf, p, sizeof buf, s) == 0 && buf[0] == pattern(p), "read");
	SYNC_IS(cuStreamSynchronize(s), 0, 0, "the read completed and nothing was sent since");
	SYNC_IS(cuStreamSynchronize(s), 0, 0, "still nothing sent");
	SYNC_IS(cuStreamSynchronize(NULL), 0, 0, "the default stream: nothing sent");
	SYNC_IS(cuCtxSynchronize(), 0, 0, "the context: nothing sent");
	SYNC_IS(cuStreamQuery(s), 0, 0, "a query: nothing sent");

	/* An async record after the read, on another stream, sends the synchronize to the server. */
	CHECK(cuMemcpyDtoH_v2(buf, p, sizeof buf) == 0, "synchronous read");
	CHECK(cuMemsetD32Async(p, 7, 4, NULL) == 0, "memset on the default stream");
	SYNC_IS(cuStreamSynchronize(s), 0, 1, "a memset on another stream after the read");
	SYNC_IS(cuCtxSynchronize(), 0, 0, "after a completed synchronize: nothing sent");
	CHECK(cuMemcpyDtoHAsync_v2(buf, p, sizeof buf, s) == 0, "read");
	CHECK(cuMemsetD32Async(p, 7, 4, s) == 0, "memset");
	SYNC_IS(cuCtxSynchronize(), 0, 1, "a memset on the stream after the read");

	/* A synchronous call that is not a synchronization (it could queue work) sends it too. */
	CHECK(cuMemcpyDtoHAsync_v2(buf, p, sizeof buf, s) == 0, "read");
	unsigned long long q = 0;
	CHECK(cuMemAlloc_v2(&q, 4096) == 0, "alloc");
	SYNC_IS(cuStreamSynchronize(s), 0, 1, "an allocation after the read");

	/* A stream the shim does not know: the server answers (invalid handle). */
	CHECK(cuMemcpyDtoHAsync_v2(buf, p, sizeof buf, s) == 0, "read");
	SYNC_IS(cuStreamSynchronize((void *)0xdead), CUDA_ERROR_INVALID_HANDLE, 1, "an unknown stream");
	SYNC_IS(cuStreamSynchronize(s), 0, 1, "after a failed synchronize");

	/* An error of earlier async work arrives with the read's answer: the read returns it, and the synchronize after
	 * it goes to the server, which answers what it knows now. */
	srv.fail_id = CALL_cuMemsetD32Async;
	srv.fail_result = CUDA_ERROR_ILLEGAL_ADDRESS;
	CHECK(cuMemsetD32Async(p, 7, 4, s) == 0, "the memset that will fail is async");
	CHECK(cuMemcpyDtoHAsync_v2(buf, p, sizeof buf, s) == CUDA_ERROR_ILLEGAL_ADDRESS,
	      "the read reports the memset's error");
	SYNC_IS(cuStreamSynchronize(s), 0, 1, "after a read that failed");
	SYNC_IS(cuStreamSynchronize(s), 0, 0, "after the synchronize that went to the server succeeded");
	/* The read itself failing. */
	srv.fail_id = CALL_cuMemcpyDtoHAsync_v2;
	srv.fail_result = CUDA_ERROR_INVALID_VALUE;
	CHECK(cuMemcpyDtoHAsync_v2(buf, p, sizeof buf, s) == CUDA_ERROR_INVALID_VALUE, "the read fails");
	SYNC_IS(cuCtxSynchronize(), 0, 1, "after a read that failed");
	/* An async error after the read: the synchronize reports it. */
	CHECK(cuMemcpyDtoHAsync_v2(buf, p, sizeof buf, s) == 0, "read");
	srv.fail_id = CALL_cuMemsetD32Async;
	srv.fail_result = CUDA_ERROR_ILLEGAL_ADDRESS;
	CHECK(cuMemsetD32Async(p, 7, 4, s) == 0, "the memset that will fail is async");
	SYNC_IS(cuStreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS, 1, "an async error after the read");

	/* While a stream captures, a synchronize goes to the server (which refuses it and invalidates the capture). */
	CHECK(cuMemcpyDtoHAsync_v2(buf, p, sizeof buf, s) == 0, "read");
	CHECK(shim_stream_capture_begin(s, 0) == 0, "capture");
	SYNC_IS(cuStreamSynchronize(NULL), 0, 1, "a stream captures");
	CHECK(shim_stream_capture_end(s) == 0, "end capture");

	srv.stop = 1;
	pthread_join(t, NULL);
	unlink(srv.path);
	return failures - failures_before;
}

static void test_sync_answers(void) {
	CHECK(in_child(sync_answers) == 0, "synchronizations answered in the shim (failures above)");
}

/* ---- the integrity check: MD2 (RFC 1319 test suite) and the published intermediate vectors of the runtime's
 * integrity check (vosen/ZLUDA dark_api/src/lib.rs tests, recorded from NVIDIA's driver), state as 66 bytes */

static void md2_hex(const char *msg, char *out) {
	struct shim_md2 m;
	uint8_t d[16];
	shim_md2_init(&m);
	shim_md2_update(&m, msg, strlen(msg), 0);
	shim_md2_final(&m, d);
	hex(out, d, 16);
}

static void state_from(struct shim_md2 *m, const uint8_t b[66]) { memcpy(m, b, 66); }

static int state_is(const struct shim_md2 *m, const uint8_t b[66]) { return memcmp(m, b, 66) == 0; }

static void test_integrity(void) {
	CHECK(sizeof(struct shim_md2) == 66, "MD2 state is %zu bytes", sizeof(struct shim_md2));
	static const char *suite[][2] = {
		{"", "8350e5a3e24c153df2275c9f80692773"},
		{"a", "32ec01ec4a6dac72c0ab96fb34c0b5d1"},
		{"abc", "da853b0d3f88d99b30283a69e6ded6bb"},
		{"message digest", "ab4f496bfb2a530b219ff33031fe06b0"},
		{"abcdefghijklmnopqrstuvwxyz", "4e8ddff3650292ab5a4108c3aa47940b"},
		{"12345678901234567890123456789012345678901234567890123456789012345678901234567890",
		 "d5976f79d83d3a0dc9806c3c66f3efd8"},
	};
	for (size_t i = 0; i < sizeof suite / sizeof suite[0]; i++) {
		char h[33];
		md2_hex(suite[i][0], h);
		CHECK(strcmp(h, suite[i][1]) == 0, "MD2(\"%s\") = %s, want %s", suite[i][0], h, suite[i][1]);
	}

	struct shim_md2 m;
	/* one byte into a state that completes no block */
	static const uint8_t one_in[66] = {
		0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0x38,
		0xc0, 0x9b, 0xf7, 0xff, 0x7f, 0,    0,    0xa3, 0x61, 0xe4, 0x42, 0xf6, 0x67, 0x94, 0xff, 0x18, 0xc0,
		0x9b, 0xf7, 0xff, 0x7f, 0,    0,    0xa4, 0x57, 0x72, 0xf7, 0xff, 0x7f, 0,    0,    0,    0,    0,
		0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0};
	static const uint8_t one_out[66] = {
		0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0x22,
		0xc0, 0x9b, 0xf7, 0xff, 0x7f, 0,    0,    0xa3, 0x61, 0xe4, 0x42, 0xf6, 0x67, 0x94, 0xff, 0x22, 0xc0,
		0x9b, 0xf7, 0xff, 0x7f, 0,    0,    0xa4, 0x57, 0x72, 0xf7, 0xff, 0x7f, 0,    0,    0x57, 0,    0,
		0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0x01, 0x57};
	state_from(&m, one_in);
	shim_md2_byte(&m, 34);
	CHECK(state_is(&m, one_out), "one byte");

	/* the inner key block */
	static const uint8_t keyed[66] = {
		0x8b, 0x21, 0x9a, 0x49, 0xe8, 0x6d, 0x1a, 0xee, 0xf2, 0x37, 0xf9, 0xb5, 0x4a, 0x8c, 0x3c, 0x75, 0xc7,
		0x1e, 0xee, 0x21, 0xcf, 0x29, 0x8a, 0xe5, 0x13, 0x83, 0xf4, 0xec, 0x33, 0x04, 0xe2, 0xfd, 0xb0, 0x2f,
		0x09, 0x01, 0x4f, 0xf7, 0x68, 0x6d, 0x69, 0x46, 0x43, 0x7e, 0xb6, 0x2b, 0x21, 0xed, 0x57, 0xa1, 0x10,
		0x86, 0x0e, 0x60, 0x44, 0x1e, 0x70, 0x5f, 0x67, 0xd1, 0xeb, 0x67, 0xa1, 0x3d, 0x00, 0x3d};
	shim_integrity_begin(&m);
	CHECK(state_is(&m, keyed), "inner key block");

	/* the process and call part of the message */
	struct {
		uint32_t driver_version, version, pid, thread;
		uint64_t cudart_table, integrity_table, fn, unix_seconds;
	} in = {0x2f30, 12082, 0x002fa423, 0xf79c1000, 0x00007ffff6958240ull, 0x00007ffff6958220ull,
		0x00007ffff2aaf4a0ull, 0x682b9cee};
	static const uint8_t after_call[66] = {
		0x0a, 0xfd, 0xab, 0xc9, 0xff, 0x9b, 0xa0, 0xbe, 0x4d, 0x30, 0x32, 0x82, 0x74, 0x4f, 0xa7, 0x48, 0x9d,
		0x23, 0x82, 0xa3, 0x87, 0xfa, 0x6c, 0xdb, 0x92, 0x49, 0xd9, 0xb5, 0x4b, 0x2b, 0x5e, 0x51, 0x6e, 0xf7,
		0xf9, 0x4d, 0x28, 0x8a, 0x64, 0x06, 0x19, 0xb3, 0xe6, 0xbe, 0xa4, 0xec, 0x7e, 0x54, 0x64, 0x28, 0xd9,
		0xe1, 0xd4, 0x34, 0xc0, 0xa9, 0x49, 0x88, 0xc9, 0x61, 0x58, 0xdd, 0x66, 0x74, 0x00, 0x74};
	CHECK(sizeof in == 48, "call part is %zu bytes", sizeof in);
	shim_md2_update(&m, &in, sizeof in, 0);
	CHECK(state_is(&m, after_call), "process and call part");

	/* one device: UUID, PCI domain, bus, device */
	static const uint8_t before_dev[66] = {
		0x84, 0xfd, 0x93, 0x10, 0xc6, 0xdb, 0xb3, 0xbc, 0x49, 0xc2, 0x25, 0xe7, 0xda, 0x6e, 0x22, 0x6f, 0x9b,
		0xbd, 0x81, 0x59, 0xc3, 0x01, 0x9a, 0x7a, 0x26, 0x34, 0x39, 0x0f, 0x2a, 0x56, 0x13, 0xb1, 0xf6, 0xbc,
		0x7f, 0xa1, 0x8f, 0x04, 0xa5, 0x4d, 0x0d, 0x78, 0xab, 0x20, 0xf8, 0x23, 0x20, 0xa5, 0x3f, 0x67, 0x36,
		0xe2, 0xde, 0x8a, 0xe5, 0xdf, 0xe1, 0xf2, 0x03, 0x94, 0xad, 0xdc, 0x9a, 0xda, 0x00, 0xda};
	static const uint8_t after_dev[66] = {
		0x1f, 0xd8, 0x25, 0xd2, 0xdf, 0xfa, 0x64, 0xc7, 0xb6, 0x1a, 0xaf, 0x22, 0xb8, 0x79, 0xfb, 0x96, 0x00,
		0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7c, 0x9d, 0x46, 0xd2, 0x1f, 0xd8,
		0x25, 0xd2, 0xdd, 0xfa, 0x64, 0xc7, 0xb6, 0x1a, 0xaf, 0x22, 0xe6, 0x17, 0xbd, 0x3a, 0xd7, 0xdd, 0x5f,
		0x82, 0x8c, 0x87, 0xce, 0x86, 0x66, 0xaf, 0xa0, 0x50, 0x7a, 0x7d, 0xbb, 0xbc, 0x0c, 0x50};
	struct {
		uint32_t uuid[4];
		int32_t domain, bus, device;
	} dev = {{0x8a2bfe9a, 0x382d25ac, 0xc5ae37ea, 0x5f32716d}, 0, 2, 0};
	CHECK(sizeof dev == 28, "device part is %zu bytes", sizeof dev);
	state_from(&m, before_dev);
	shim_md2_update(&m, &dev, sizeof dev, 0);
	CHECK(state_is(&m, after_dev), "device part");

	/* padding and checksum: the digest is the first 16 bytes */
	static const uint8_t before_final[66] = {
		0x3e, 0x4b, 0xf2, 0x95, 0x71, 0xf5, 0x6b, 0x51, 0x07, 0xbf, 0x4b, 0xf1, 0x04, 0x0e, 0x8e, 0x0b, 0x5f,
		0x4d, 0x30, 0x0c, 0x0f, 0x0c, 0xae, 0xfb, 0x48, 0xaf, 0x23, 0xb5, 0xea, 0x4c, 0xc2, 0xdb, 0xd7, 0xdf,
		0x88, 0x74, 0x39, 0x58, 0x16, 0x3a, 0x1f, 0x7c, 0x9b, 0x20, 0x7e, 0x7e, 0x94, 0xc8, 0x8b, 0xc6, 0xb2,
		0x38, 0x0d, 0x07, 0x7d, 0xbd, 0x90, 0xd5, 0x39, 0x63, 0xeb, 0x1d, 0x4f, 0x40, 0x00, 0x40};
	static const uint8_t after_final[66] = {
		0x00, 0x23, 0x53, 0x06, 0x5e, 0x96, 0xf6, 0x9c, 0x61, 0xaa, 0x96, 0x2d, 0x2e, 0xcd, 0xa8, 0x58, 0xe9,
		0xca, 0xc0, 0x2e, 0x35, 0xed, 0x5f, 0xca, 0xe1, 0x0e, 0xcd, 0x1f, 0xd0, 0x8e, 0x8b, 0x9c, 0x29, 0x4d,
		0x1c, 0x94, 0x6b, 0xf7, 0x10, 0xb0, 0x07, 0x08, 0x91, 0xd6, 0x14, 0x06, 0xc0, 0xec, 0xe1, 0x9c, 0x8e,
		0x33, 0xd4, 0xe9, 0x43, 0x5c, 0x86, 0x0c, 0x72, 0x4d, 0x27, 0x98, 0x91, 0x7f, 0x00, 0x7f};
	uint8_t digest[16];
	state_from(&m, before_final);
	shim_md2_final(&m, digest);
	CHECK(state_is(&m, after_final), "padding and checksum");
	CHECK(memcmp(digest, after_final, 16) == 0, "digest");

	/* versions ending in 0 or 1 get constants */
	uint64_t out[2];
	CHECK(shim_integrity_check(13000, 0, out, NULL) == 0 && out[0] == 0x3341181c03cb675cull &&
		  out[1] == 0x8ed383aa1f4cd1e8ull,
	      "version %% 10 == 0");
	CHECK(shim_integrity_check(12081, 0, out, NULL) == 0 && out[0] == 0x1841181c03cb675cull, "version %% 10 == 1");
}

/* ---- private tables (exports.c) */

static const void **table(const char *uuid_hex) {
	uint8_t u[16];
	for (int i = 0; i < 16; i++) sscanf(uuid_hex + 2 * i, "%2hhx", &u[i]);
	const void **t = NULL;
	int r = cuGetExportTable((const void **)&t, u);
	CHECK(r == 0 && t != NULL, "cuGetExportTable(%s): %d", uuid_hex, r);
	return t;
}

typedef int (*slot_fn)();

static int dtor_calls;
static void *dtor_value;
static void count_dtor(void *ctx, void *key, void *value) {
	(void)ctx, (void)key;
	dtor_calls++;
	dtor_value = value;
}

static void test_tables(void) {
	static const struct {
		const char *uuid;
		size_t size; /* bytes in slot 0; 0: no size header */
	} known[] = {
		{"6bd5fb6c5bf4e74a8987d93912fd9df9", 13 * 8}, {"42d85a8123f6cb478298f6e78a3aecdc", 3 * 8},
		{"a094798c2e742e7493f20800200c0a66", 7 * 8},  {"c693336e1121df11a8c368f355d89593", 0},
		{"b10541e1f7c7c74a9f64f223be99f1e2", 26 * 8}, {"d4082055bde6704b8d34ba123c66e1f2", 3 * 8},
		{"263e88607cd2614392f6bbd5006dfa7e", 15 * 8}, {"0ca50b8c1004929a89a7d0df10e77286", 2 * 8},
		{"195bcbf4d67d024aacc51d29cea631ae", 3 * 8},  {"21318c60971432488ca641ff7324c8f2", 93 * 8},
		{"f8cff95121468b4eb9e2fb469e7c0dd9", 3 * 8},  {"69a28e9f24498b47b030c5da330ea4e9", 34 * 8},
	};
	for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
		const void **t = table(known[i].uuid);
		if (t == NULL) continue;
		CHECK(t == table(known[i].uuid), "%s: the same table every time", known[i].uuid);
		if (known[i].size) CHECK((size_t)t[0] == known[i].size, "%s: size %zu", known[i].uuid, (size_t)t[0]);
	}
	CHECK(cuGetExportTable(NULL, "0123456789abcdef") == 1, "NULL result pointer");
	const void **t = NULL;
	CHECK(cuGetExportTable((const void **)&t, NULL) == 1, "NULL UUID");

	/* CUDART_INTERFACE: slot 7 does nothing, slot 12 succeeds, an unemulated slot is logged and refused */
	const void **cudart = table("6bd5fb6c5bf4e74a8987d93912fd9df9");
	((void (*)(size_t))cudart[7])(4096);
	CHECK(((slot_fn)cudart[12])() == 0, "CUDART_INTERFACE[12]");
	uint64_t unknown = shim_stats.unknown_slots;
	CHECK(((slot_fn)cudart[3])() == 801 && shim_stats.unknown_slots == unknown + 1, "CUDART_INTERFACE[3] is a stub");

	/* TOOLS: no tool attached */
	const void **tls = table("42d85a8123f6cb478298f6e78a3aecdc");
	CHECK(((slot_fn)tls[1])(NULL) == 0, "TOOLS_TLS[1]");
	void *state = NULL;
	CHECK(((slot_fn)tls[2])(&state) == 0 && state == shim_primary_ctx(), "TOOLS_TLS[2]: %p", state);
	uint64_t id = 0;
	const void **ids = table("21318c60971432488ca641ff7324c8f2");
	CHECK((size_t)ids[0] == 93 * 8, "TOOLS_CONTEXT_ID size");
	CHECK(((slot_fn)ids[4])(state, &id) == 0 && id == 1, "TOOLS_CONTEXT_ID[4]: %llu", (unsigned long long)id);
	CHECK(((slot_fn)ids[4])(state, NULL) == 1, "TOOLS_CONTEXT_ID[4] without a result");
	const void **hooks = table("a094798c2e742e7493f20800200c0a66");
	void *buf = NULL;
	size_t n = 0;
	((void (*)(void **, size_t *))hooks[2])(&buf, &n);
	CHECK(buf != NULL && n == 1024, "hooks[2]: %p %zu", buf, n);
	((void (*)(void **, size_t *))hooks[6])(&buf, &n);
	CHECK(buf != NULL && n == 14, "hooks[6]: %p %zu", buf, n);

	/* CONTEXT_LOCAL_STORAGE */
	const void **cls = table("c693336e1121df11a8c368f355d89593");
	int (*put)(void *, void *, void *, void (*)(void *, void *, void *)) = (void *)cls[0];
	int (*del)(void *, void *) = (void *)cls[1];
	int (*get)(void **, void *, void *) = (void *)cls[2];
	void *ctx = NULL, *v = NULL;
	int key1, key2;
	ctx = shim_primary_ctx();
	CHECK(get(&v, NULL, &key1) == 400, "missing key: CUDA_ERROR_INVALID_HANDLE");
	CHECK(put(NULL, &key1, (void *)0x1234, count_dtor) == 0, "put (current context)");
	CHECK(get(&v, ctx, &key1) == 0 && v == (void *)0x1234, "get by the context: %p", v);
	CHECK(get(&v, (void *)-1, &key1) == 0 && v == (void *)0x1234, "get by (CUcontext)-1: %p", v);
	CHECK(put(ctx, &key1, (void *)0x5678, count_dtor) == 0 && get(&v, NULL, &key1) == 0 && v == (void *)0x5678,
	      "put replaces");
	CHECK(put(ctx, &key2, (void *)0x9, NULL) == 0 && del(NULL, &key2) == 0 && get(&v, NULL, &key2) == 400,
	      "delete");
	CHECK(del(NULL, &key2) == 400, "delete twice");
	CHECK(get(NULL, NULL, &key1) == 1, "NULL value pointer");
	dtor_calls = 0;
	shim_context_storage_destroy(ctx);
	CHECK(dtor_calls == 1 && dtor_value == (void *)0x5678, "destroying the context runs the dtor (%d)", dtor_calls);
	CHECK(get(&v, NULL, &key1) == 400, "storage gone with the context");

	/* CONTEXT_CHECKS: cuBLAS 13 needs slot 1 to refuse and slot 2 to leave its second result alone */
	const void **checks = table("263e88607cd2614392f6bbd5006dfa7e");
	CHECK(((slot_fn)checks[1])(NULL, NULL, NULL) == 801, "CONTEXT_CHECKS[1]");
	uint32_t r1 = 7;
	const void *r2 = (void *)0x42;
	CHECK(((slot_fn)checks[2])(NULL, &r1, &r2) == 0 && r1 == 0 && r2 == (void *)0x42, "CONTEXT_CHECKS[2]");
	CHECK(((slot_fn)checks[3])() == 0, "CONTEXT_CHECKS[3]");
	unknown = shim_stats.unknown_slots;
	CHECK(((slot_fn)checks[14])() == 801 && shim_stats.unknown_slots == unknown + 1, "CONTEXT_CHECKS[14] is a stub");
	CHECK(((slot_fn)table("0ca50b8c1004929a89a7d0df10e77286")[1])() == 801, "CTX_CREATE_BYPASS[1]");
	CHECK(((slot_fn)table("195bcbf4d67d024aacc51d29cea631ae")[1])() == 801, "HEAP_ACCESS[1]");

	/* an unknown UUID: a table of 128 stub slots, each refusing and counted */
	const void **other = table("00112233445566778899aabbccddeeff");
	CHECK(other != NULL && (size_t)other[0] == 128 * 8, "stub table size %zu", other ? (size_t)other[0] : 0);
	if (other != NULL) {
		unknown = shim_stats.unknown_slots;
		static const int sample[] = {1, 2, 64, 127};
		for (size_t i = 0; i < sizeof sample / sizeof sample[0]; i++)
			CHECK(((slot_fn)other[sample[i]])() == 801, "stub slot %d", sample[i]);
		CHECK(((slot_fn)other[64])() == 801, "stub slot 64 again (logged once)");
		CHECK(shim_stats.unknown_slots == unknown + 5, "stub slots counted");
		CHECK(other == table("00112233445566778899aabbccddeeff"), "the same stub table again");
		CHECK(other != table("00112233445566778899aabbccddee00"), "another UUID, another table");
	}
}

/* Slots that need the device (called after cuInit by test_records). */
static void test_device_slots(void) {
	const void **ext = table("b10541e1f7c7c74a9f64f223be99f1e2");
	size_t res[2] = {1, 1};
	CHECK(((int (*)(int, unsigned, int, size_t *))ext[5])(0, 75, 0, res) == 0 && res[0] == 9 && res[1] == 0,
	      "DEVICE_EXTENDED_RT[5]: compute capability major %zu", res[0]);
	uint8_t flag = 1;
	CHECK(((slot_fn)ext[13])(&flag, 0) == 0 && flag == 0, "DEVICE_EXTENDED_RT[13]");

	/* the integrity check hashes what the shim reports about this process and its device */
	const void **ic = table("d4082055bde6704b8d34ba123c66e1f2");
	uint64_t got[2] = {0, 0}, want[2];
	CHECK(((int (*)(unsigned, uint64_t, uint64_t *))ic[1])(13002, 1795395056ull, got) == 0, "integrity check");
	struct shim_md2 m;
	shim_integrity_begin(&m);
	struct {
		uint32_t driver_version, version, pid, thread;
		const void *cudart, *integrity, *fn;
		uint64_t t;
	} in = {13000, 13002, (uint32_t)getpid(), (uint32_t)(uintptr_t)pthread_self(),
		table("6bd5fb6c5bf4e74a8987d93912fd9df9"), ic, ic[1], 1795395056ull};
	shim_md2_update(&m, &in, sizeof in, 0);
	struct {
		uint8_t uuid[16];
		int32_t domain, bus, device;
	} d;
	cuDeviceGetUuid_v2(d.uuid, 0);
	cuDeviceGetAttribute(&d.domain, 50, 0);
	cuDeviceGetAttribute(&d.bus, 33, 0);
	cuDeviceGetAttribute(&d.device, 34, 0);
	shim_md2_update(&m, &d, sizeof d, 0);
	shim_integrity_end(&m, want);
	CHECK(got[0] == want[0] && got[1] == want[1], "integrity %016llx %016llx, want %016llx %016llx",
	      (unsigned long long)got[0], (unsigned long long)got[1], (unsigned long long)want[0],
	      (unsigned long long)want[1]);
}

/* ---- the real driver's answers (shim/testdata/trace, recorded on an H100 with driver 580): every
 * cuGetProcAddress request PyTorch, cuBLAS and cuDNN made resolves to the same variant, and every function the
 * real libcuda.so.1 exports is exported here too, except its undocumented and debugger entry points. */

static void test_fixture(void) {
	FILE *f = fopen("../testdata/trace/trace-pytorch-h100.tsv", "r");
	CHECK(f != NULL, "open the trace fixture");
	if (f == NULL) return;
	char line[1024];
	int n = 0;
	while (fgets(line, sizeof line, f) != NULL) {
		char name[256] = "", real[256] = "";
		int version, status, times;
		unsigned long long flags;
		int result;
		line[strcspn(line, "\n")] = 0;
		char uuid[64], kind[16];
		int words;
		if (sscanf(line, "table\t%63s\t%15s\t%d", uuid, kind, &words) == 3) {
			/* every table the driver handed out is known, with the driver's size */
			char hexid[33];
			int k = 0;
			for (char *c = uuid; *c && k < 32; c++)
				if (*c != '-') hexid[k++] = *c;
			hexid[k] = 0;
			const void **t = table(hexid);
			uint64_t before = shim_stats.unknown_slots;
			if (t != NULL && strcmp(kind, "header") == 0)
				CHECK((size_t)t[0] == (size_t)words * 8, "table %s: %zu bytes, the driver's has %d words", uuid,
				      (size_t)t[0], words);
			CHECK(shim_stats.unknown_slots == before, "table %s", uuid);
			continue;
		}
		if (strncmp(line, "resolve\t", 8) != 0) continue;
		/* resolve <name> <version> <flags> <result> <status> <real function> <times>; the name may be empty */
		char *p = line + 8, *tab = strchr(p, '\t');
		if (tab == NULL) continue;
		snprintf(name, sizeof name, "%.*s", (int)(tab - p), p);
		if (sscanf(tab + 1, "%d\t%llu\t%d\t%d\t%255s\t%d", &version, &flags, &result, &status, real, &times) != 6)
			continue;
		n++;
		int st = -1;
		const struct shim_variant *v = shim_resolve(name, version, (flags & 2) != 0, &st);
		if (strcmp(real, "-") == 0) {
			CHECK(v == NULL && st == status, "%s at %d flags %llu: want not found (status %d), got %s (status %d)",
			      name, version, flags, status, v != NULL ? v->symbol : "-", st);
			continue;
		}
		CHECK(v != NULL && strcmp(v->symbol, real) == 0 && st == 0, "%s at %d flags %llu: driver %s, shim %s", name,
		      version, flags, real, v != NULL ? v->symbol : "-");
	}
	fclose(f);
	CHECK(n > 400, "only %d resolve lines in the fixture", n);

	/* Every entry point the traced run called is implemented: by name for exports found with dlsym, by the
	 * variant the driver resolved for those found with cuGetProcAddress. */
	f = fopen("../testdata/trace/trace-pytorch-h100.tsv", "r");
	static char resolved[1024][2][128]; /* name asked for -> variant */
	int nresolved = 0, called = 0;
	while (f != NULL && fgets(line, sizeof line, f) != NULL) {
		char name[128], real[128];
		int version, result, status;
		unsigned long long flags;
		line[strcspn(line, "\n")] = 0;
		if (sscanf(line, "resolve\t%127s\t%d\t%llu\t%d\t%d\t%127s", name, &version, &flags, &result, &status,
			   real) == 6 && strcmp(real, "-") != 0 && nresolved < 1024) {
			snprintf(resolved[nresolved][0], 128, "%s", name);
			snprintf(resolved[nresolved++][1], 128, "%s", real);
		}
	}
	if (f != NULL) rewind(f);
	while (f != NULL && fgets(line, sizeof line, f) != NULL) {
		char kind[16], name[128];
		int calls;
		line[strcspn(line, "\n")] = 0;
		if (sscanf(line, "%15s\t%127s\t%d", kind, name, &calls) != 3) continue;
		int export = strcmp(kind, "export") == 0, proc = strcmp(kind, "proc") == 0;
		if (!export && !proc) continue;
		for (int i = 0; i < nresolved || export; i++) {
			const char *sym = export ? name : strcmp(resolved[i][0], name) == 0 ? resolved[i][1] : NULL;
			if (sym != NULL) {
				called++;
				int stub = 1;
				for (size_t j = 0; j < shim_nprocs; j++)
					if (strcmp(shim_procs[j].name, sym) == 0) stub = shim_procs[j].stub;
				CHECK(!stub, "the traced run called %s %d times (as %s); the shim has only a stub", name, calls,
				      sym);
			}
			if (export) break;
		}
	}
	if (f != NULL) fclose(f);
	CHECK(called > 50, "only %d called entry points in the fixture", called);

	const char *lib = getenv("SHIM_LIB");
	f = fopen("../testdata/trace/libcuda-exports-580.159.04.txt", "r");
	CHECK(f != NULL, "open the export list");
	void *h = lib != NULL ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : NULL;
	int missing = 0, total = 0;
	while (f != NULL && h != NULL && fgets(line, sizeof line, f) != NULL) {
		line[strcspn(line, "\n")] = 0;
		if (line[0] == 0) continue;
		total++;
		/* The debugger interface and two undocumented functions no header declares. */
		if (strncmp(line, "cudbg", 5) == 0 || strcmp(line, "cuEGLApiInit") == 0 ||
		    strncmp(line, "cuMemGetAttribute", 17) == 0)
			continue;
		if (dlsym(h, line) == NULL) {
			missing++;
			CHECK(0, "the real driver exports %s, the shim does not", line);
		}
	}
	CHECK(total > 600, "only %d exports in the list", total);
	if (f != NULL) fclose(f);
	if (h != NULL) dlclose(h);
}

/* The built library exports the CUDA entry points and nothing of the shim's internals. */
static void test_exports(void) {
	const char *lib = getenv("SHIM_LIB");
	if (lib == NULL) return;
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	CHECK(h != NULL, "dlopen %s: %s", lib, dlerror());
	if (h == NULL) return;
	/* dlsym and cuGetProcAddress agree: aliases point at their target's code. */
	int (*gpa)(const char *, void **, int, unsigned long long, int *) = dlsym(h, "cuGetProcAddress_v2");
	for (size_t i = 0; i < shim_nprocs; i++) {
		void *f = dlsym(h, shim_procs[i].name);
		CHECK(f != NULL, "%s is not exported", shim_procs[i].name);
		for (size_t j = 0; f != NULL && gpa != NULL && j < shim_nentries; j++) {
			const struct shim_entry *e = &shim_entries[j];
			for (unsigned k = e->first; k < e->first + e->count; k++) {
				if (strcmp(shim_variants[k].symbol, shim_procs[i].name) != 0) continue;
				void *g = NULL;
				gpa(e->base, &g, shim_variants[k].version, shim_variants[k].per_thread ? 2 : 0, NULL);
				CHECK(g == f, "%s: dlsym %p, cuGetProcAddress %p", shim_procs[i].name, f, g);
			}
		}
	}
	CHECK(dlsym(h, "shim_call_begin") == NULL, "internal symbol shim_call_begin is exported");
	CHECK(dlsym(h, "rpc_cuLaunchKernel") == NULL, "internal symbol rpc_cuLaunchKernel is exported");
	dlclose(h);
}

int main(void) {
	test_exports();
	test_local();
	test_procaddr();
	test_fixture();
	test_integrity();
	test_tables();
	test_refusals();
	test_sync_answers();
	test_records();
	if (failures) {
		fprintf(stderr, "%d failure(s)\n", failures);
		return 1;
	}
	printf("shim C tests: ok\n");
	return 0;
}
