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

#include "calls_gen.h"

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
int cuGraphCreate(void *, unsigned);

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
} srv;

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
	switch (id) {
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
	case CALL_cuMemcpyDtoH_v2: {
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
	if (flags & SHIM_RECORD_FLAG_SYNC) respond(seq, 0, out, len);
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

	void *fn = NULL;
	int status = -1;
	CHECK(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 0, &status) == 0 && fn == (void *)cuMemAlloc_v2 &&
		  status == 0,
	      "cuMemAlloc resolves to cuMemAlloc_v2 (%p)", fn);
	CHECK(cuGetProcAddress_v2("cuLaunchKernel", &fn, 12000, 2, &status) == 0 && fn == (void *)cuLaunchKernel,
	      "cuLaunchKernel with the per-thread flag");
	CHECK(cuGetProcAddress_v2("cuGetProcAddress", &fn, 12000, 0, NULL) == 0 && fn == (void *)cuGetProcAddress_v2,
	      "cuGetProcAddress resolves to _v2");
	CHECK(cuGetProcAddress_v2("cuNoSuchFunction", &fn, 12000, 0, &status) == 500 && fn == NULL && status == 1,
	      "unknown symbol: CUDA_ERROR_NOT_FOUND");
	CHECK(cuGetProcAddress_v2("cuGraphCreate", &fn, 12000, 0, NULL) == 0 && fn == (void *)cuGraphCreate,
	      "unsupported entry points are discoverable");
	CHECK(cuGraphCreate(NULL, 0) == 801, "unsupported call returns CUDA_ERROR_NOT_SUPPORTED");
	CHECK(cuGraphCreate(NULL, 0) == 801, "unsupported call returns CUDA_ERROR_NOT_SUPPORTED twice");
	uint8_t uuid[16] = {1, 2, 3};
	const void *table = (void *)1;
	CHECK(cuGetExportTable(&table, uuid) == 801 && table == NULL, "export tables are not supported yet");
	/* Every entry of the proc table resolves to itself. */
	for (size_t i = 0; i < shim_nprocs; i++) {
		CHECK(i == 0 || strcmp(shim_procs[i - 1].name, shim_procs[i].name) < 0, "proc table not sorted at %s",
		      shim_procs[i].name);
		CHECK(cuGetProcAddress_v2(shim_procs[i].name, &fn, 13000, 0, NULL) == 0 && fn != NULL,
		      "%s does not resolve", shim_procs[i].name);
	}
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

/* The built library exports the CUDA entry points and nothing of the shim's internals. */
static void test_exports(void) {
	const char *lib = getenv("SHIM_LIB");
	if (lib == NULL) return;
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	CHECK(h != NULL, "dlopen %s: %s", lib, dlerror());
	if (h == NULL) return;
	for (size_t i = 0; i < shim_nprocs; i++)
		CHECK(dlsym(h, shim_procs[i].name) != NULL, "%s is not exported", shim_procs[i].name);
	CHECK(dlsym(h, "shim_call_begin") == NULL, "internal symbol shim_call_begin is exported");
	CHECK(dlsym(h, "rpc_cuLaunchKernel") == NULL, "internal symbol rpc_cuLaunchKernel is exported");
	dlclose(h);
}

int main(void) {
	test_exports();
	test_local();
	test_refusals();
	test_records();
	if (failures) {
		fprintf(stderr, "%d failure(s)\n", failures);
		return 1;
	}
	printf("shim C tests: ok\n");
	return 0;
}
