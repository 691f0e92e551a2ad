/*
 * transport.c: the client side of the remoting transport (docs/design.md, decision 5).
 *
 * A Unix stream socket carries the hello (with the shared memory's memfd as SCM_RIGHTS) and one-byte doorbells.
 * The shared memory holds a control block, a request ring of call records, and a response area. Every record is
 * published (the tail pointer moved) as soon as it is written, so that the server works while the client goes on
 * issuing: a GPU idle while the client issues is latency lost (docs/design.md, decision 5). What is batched is the
 * doorbells: the client rings only when the server sleeps. Both sides spin briefly before sleeping on the socket; a
 * side that sleeps sets its waiting flag and the other side rings the doorbell (Dekker-style: store, full fence,
 * load).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

#ifndef MFD_ALLOW_SEALING
#define MFD_ALLOW_SEALING 0x0002U
#endif
#ifndef F_ADD_SEALS
#define F_ADD_SEALS 1033
#define F_SEAL_SEAL 0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#endif

static struct {
	pthread_mutex_t init_mu; /* guards connecting */
	pthread_mutex_t mu;      /* guards the ring: held from shim_call_begin to shim_call_done */
	int state;               /* 0 not connected, 1 connected, -1 failed for good */
	int err;                 /* CUresult of the failure */
	int fd;
	uint8_t *shm;
	size_t shm_size;
	uint8_t *ring;
	uint64_t ring_size;
	uint8_t *resp;
	uint64_t resp_size;
	uint64_t tail;      /* bytes written */
	uint64_t published; /* bytes published */
	uint64_t seq;
	int drained;        /* shim_drained */
	int local_sync;     /* FAAS_GPU_REMOTING_LOCAL_SYNC (default 1): shim_drained may say yes */
	int sync_all;       /* FAAS_GPU_REMOTING_SYNC (default 0) */
	long spin_ns;       /* FAAS_GPU_REMOTING_SPIN_US (default 50) */
	int debug;          /* FAAS_GPU_SHIM_DEBUG */
	uint64_t not_simulated; /* results SHIM_RESULT_KERNEL_NOT_SIMULATED (faas_gpu_kernels_not_simulated) */
	struct shim_device dev;
} g = {
	.init_mu = PTHREAD_MUTEX_INITIALIZER,
	.mu = PTHREAD_MUTEX_INITIALIZER,
	.fd = -1,
	.debug = -1,
};

#define CTL(off, type) ((type *)(g.shm + (off)))

/* The call log (faasGpuShimCallLog): one entry per remoted call, guarded by g.mu. */
struct calllog_entry {
	uint64_t begin, end; /* CLOCK_MONOTONIC ns: entering shim_call_begin, leaving shim_call_done */
	uint64_t local;      /* shim_stats.local_calls when the call began */
	uint32_t size;       /* record bytes */
	uint16_t id;
	uint16_t wait;       /* 1: the caller waited for the result */
};
static struct {
	int on;
	char path[4096];
	struct calllog_entry *e;
	size_t n, cap;
	struct calllog_entry cur;
} calllog;
#define CALLLOG_MAX (1u << 22)

static uint64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static inline void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

void shim_log(const char *fmt, ...) {
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	fprintf(stderr, "faas-gpu shim: %s\n", buf);
}

static long env_long(const char *name, long def) {
	const char *v = getenv(name);
	if (v == NULL || *v == 0) return def;
	char *end;
	long x = strtol(v, &end, 10);
	if (*end != 0 || x < 0) {
		shim_log("%s=%s is not a non-negative integer; using %ld", name, v, def);
		return def;
	}
	return x;
}

/* FAAS_GPU_SHIM_DEBUG: 1 logs connections and private tables, 2 also every cuGetProcAddress. Read on first use:
 * entry points are looked up before cuInit. */
int shim_debug(void) {
	int d = __atomic_load_n(&g.debug, __ATOMIC_RELAXED);
	if (d < 0) {
		d = (int)env_long("FAAS_GPU_SHIM_DEBUG", 0);
		__atomic_store_n(&g.debug, d, __ATOMIC_RELAXED);
	}
	return d;
}

int shim_unsupported(const char *name) {
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	static const char *logged[512];
	static size_t n;
	int found = 0;
	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < n; i++)
		if (logged[i] == name || strcmp(logged[i], name) == 0) found = 1;
	if (!found && n < sizeof logged / sizeof logged[0]) logged[n++] = name;
	pthread_mutex_unlock(&mu);
	SHIM_COUNT(unsupported);
	if (!found) shim_log("%s is not supported by the shim: returning CUDA_ERROR_NOT_SUPPORTED", name);
	return CUDA_ERROR_NOT_SUPPORTED;
}

int shim_null_arg(const char *call, const char *arg) {
	if (shim_debug()) shim_log("%s: %s is NULL", call, arg);
	return CUDA_ERROR_INVALID_VALUE;
}


/* fail marks the connection broken for good and returns err. */
static int fail(int err) {
	g.state = -1;
	g.drained = 0;
	g.err = err;
	return err;
}

static void reset_after_fork(void) {
	/* The child must not share the parent's ring: it reconnects on its first call. */
	if (g.shm != NULL) munmap(g.shm, g.shm_size);
	if (g.fd >= 0) close(g.fd);
	g.shm = NULL;
	g.fd = -1;
	g.state = 0;
	g.drained = 0;
	g.tail = g.published = 0;
	pthread_mutex_init(&g.mu, NULL);
	pthread_mutex_init(&g.init_mu, NULL);
}

static int connect_locked(void) {
	static int atfork;
	if (!atfork) {
		pthread_atfork(NULL, NULL, reset_after_fork);
		atfork = 1;
	}
	g.sync_all = env_long("FAAS_GPU_REMOTING_SYNC", 0) != 0;
	g.local_sync = env_long("FAAS_GPU_REMOTING_LOCAL_SYNC", 1) != 0;
	g.spin_ns = env_long("FAAS_GPU_REMOTING_SPIN_US", 50) * 1000;
	long ring_mb = env_long("FAAS_GPU_REMOTING_RING_MB", 8);
	if (ring_mb < 1) ring_mb = 1;
	if (ring_mb > 1024) ring_mb = 1024;
	const char *path = getenv("FAAS_GPU_REMOTING_SOCKET");
	if (path == NULL || *path == 0) {
		shim_log("FAAS_GPU_REMOTING_SOCKET is not set: no gpuserver to forward CUDA calls to");
		return fail(CUDA_ERROR_NO_DEVICE);
	}
	const char *function = getenv("FAAS_GPU_FUNCTION");
	const char *token = getenv("FAAS_GPU_TOKEN");
	if (function == NULL) function = "";
	if (token == NULL) token = "";
	if (strlen(function) >= SHIM_NAME_MAX || strlen(token) >= SHIM_NAME_MAX) {
		shim_log("FAAS_GPU_FUNCTION or FAAS_GPU_TOKEN longer than %d bytes", (int)SHIM_NAME_MAX - 1);
		return fail(CUDA_ERROR_INVALID_VALUE);
	}

	g.ring_size = (uint64_t)ring_mb << 20;
	g.resp_size = g.ring_size / 2;
	g.shm_size = SHIM_CONTROL_SIZE + g.ring_size + g.resp_size;
	int mfd = memfd_create("faas-gpu-remoting", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (mfd < 0) {
		shim_log("memfd_create: %s", strerror(errno));
		return fail(CUDA_ERROR_OUT_OF_MEMORY);
	}
	if (ftruncate(mfd, (off_t)g.shm_size) != 0 ||
	    fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
		shim_log("shared memory of %zu bytes: %s", g.shm_size, strerror(errno));
		close(mfd);
		return fail(CUDA_ERROR_OUT_OF_MEMORY);
	}
	g.shm = mmap(NULL, g.shm_size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (g.shm == MAP_FAILED) {
		g.shm = NULL;
		shim_log("mmap shared memory: %s", strerror(errno));
		close(mfd);
		return fail(CUDA_ERROR_OUT_OF_MEMORY);
	}
	g.ring = g.shm + SHIM_CONTROL_SIZE;
	g.resp = g.ring + g.ring_size;
	*CTL(SHIM_CTL_MAGIC, uint32_t) = (uint32_t)SHIM_MAGIC;
	*CTL(SHIM_CTL_MAJOR, uint16_t) = (uint16_t)SHIM_VERSION_MAJOR;
	*CTL(SHIM_CTL_MINOR, uint16_t) = (uint16_t)SHIM_VERSION_MINOR;
	*CTL(SHIM_CTL_CONTROL_SIZE, uint32_t) = (uint32_t)SHIM_CONTROL_SIZE;
	*CTL(SHIM_CTL_RING_OFFSET, uint64_t) = SHIM_CONTROL_SIZE;
	*CTL(SHIM_CTL_RING_SIZE, uint64_t) = g.ring_size;
	*CTL(SHIM_CTL_RESP_OFFSET, uint64_t) = SHIM_CONTROL_SIZE + g.ring_size;
	*CTL(SHIM_CTL_RESP_SIZE, uint64_t) = g.resp_size;

	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof addr.sun_path) {
		shim_log("FAAS_GPU_REMOTING_SOCKET %s: path too long", path);
		close(mfd);
		if (fd >= 0) close(fd);
		return fail(CUDA_ERROR_INVALID_VALUE);
	}
	strcpy(addr.sun_path, path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
		shim_log("connect to gpuserver at %s: %s", path, strerror(errno));
		close(mfd);
		if (fd >= 0) close(fd);
		return fail(CUDA_ERROR_NO_DEVICE);
	}

	/* The instance block follows the hello when the process names its instance (FAAS_GPU_INSTANCE, which the
	 * template sets from the replica's host name): each instance has device memory of its own at addresses of its
	 * own, so a function's instances are bound on several GPUs at once (docs/design.md, decision 10). */
	const char *instance = getenv("FAAS_GPU_INSTANCE");
	if (instance == NULL) instance = "";
	if (strlen(instance) >= SHIM_HELLO_INSTANCE_SIZE) {
		shim_log("FAAS_GPU_INSTANCE longer than %d bytes", (int)SHIM_HELLO_INSTANCE_SIZE - 1);
		close(mfd);
		close(fd);
		return fail(CUDA_ERROR_INVALID_VALUE);
	}
	uint8_t hello[SHIM_HELLO_SIZE + SHIM_HELLO_INSTANCE_SIZE];
	size_t hello_len = SHIM_HELLO_SIZE;
	memset(hello, 0, sizeof hello);
	if (*instance) {
		put32(hello + SHIM_HELLO_FLAGS, (uint32_t)SHIM_HELLO_FLAG_INSTANCE);
		strcpy((char *)hello + SHIM_HELLO_SIZE, instance);
		hello_len += SHIM_HELLO_INSTANCE_SIZE;
	}
	put32(hello, (uint32_t)SHIM_MAGIC);
	put16(hello + 4, (uint16_t)SHIM_VERSION_MAJOR);
	put16(hello + 6, (uint16_t)SHIM_VERSION_MINOR);
	put32(hello + SHIM_HELLO_PID, (uint32_t)getpid());
	put64(hello + SHIM_HELLO_SHM_SIZE, g.shm_size);
	strcpy((char *)hello + SHIM_HELLO_FUNCTION, function);
	strcpy((char *)hello + SHIM_HELLO_TOKEN, token);
	struct iovec iov = {.iov_base = hello, .iov_len = hello_len};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &mfd, sizeof(int));
	ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
	close(mfd);
	if (n != (ssize_t)hello_len) {
		shim_log("send hello to gpuserver: %s", n < 0 ? strerror(errno) : "short write");
		close(fd);
		return fail(CUDA_ERROR_NO_DEVICE);
	}
	uint8_t reply[SHIM_REPLY_SIZE];
	size_t got = 0;
	while (got < sizeof reply) {
		n = read(fd, reply + got, sizeof reply - got);
		if (n < 0 && errno == EINTR) continue;
		if (n <= 0) break;
		got += (size_t)n;
	}
	if (got < 12) {
		shim_log("gpuserver closed the connection during the hello");
		close(fd);
		return fail(CUDA_ERROR_NO_DEVICE);
	}
	if (get32(reply) != (uint32_t)SHIM_MAGIC) {
		shim_log("gpuserver at %s answered with a bad magic number %#x: not a faas-gpu remoting socket", path,
			 get32(reply));
		close(fd);
		return fail(CUDA_ERROR_NO_DEVICE);
	}
	int status = (int)get32(reply + SHIM_REPLY_STATUS);
	if (status != (int)SHIM_STATUS_OK || got < sizeof reply) {
		char message[257];
		memset(message, 0, sizeof message);
		if (got == sizeof reply) memcpy(message, reply + SHIM_REPLY_MESSAGE, 256);
		uint16_t major, minor;
		memcpy(&major, reply + 4, 2);
		memcpy(&minor, reply + 6, 2);
		shim_log("gpuserver refused the connection (status %d, server protocol %u.%u, shim %u.%u): %s", status,
			 major, minor, (unsigned)SHIM_VERSION_MAJOR, (unsigned)SHIM_VERSION_MINOR, message);
		close(fd);
		switch (status) {
		case SHIM_STATUS_VERSION:
			return fail(803); /* CUDA_ERROR_SYSTEM_DRIVER_MISMATCH */
		case SHIM_STATUS_IDENTITY:
			return fail(CUDA_ERROR_NOT_PERMITTED);
		default:
			return fail(CUDA_ERROR_NO_DEVICE);
		}
	}
	memcpy(g.dev.name, reply + SHIM_REPLY_DEVICE_NAME, sizeof g.dev.name);
	g.dev.name[sizeof g.dev.name - 1] = 0;
	memcpy(g.dev.uuid, reply + SHIM_REPLY_UUID, sizeof g.dev.uuid);
	g.dev.total_mem = get64(reply + SHIM_REPLY_TOTAL_MEM);
	g.dev.va_base = get64(reply + SHIM_REPLY_VABASE);
	g.dev.va_size = get64(reply + SHIM_REPLY_VASIZE);
	memcpy(g.dev.attrs, reply + SHIM_REPLY_ATTRS, sizeof g.dev.attrs);
	int fl = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	g.fd = fd;
	g.state = 1;
	if (shim_debug())
		shim_log("connected to %s as function %s (%s, %llu bytes, sync %d)", path, function, g.dev.name,
			 (unsigned long long)g.dev.total_mem, g.sync_all);
	return CUDA_SUCCESS;
}

int shim_connect(void) {
	if (__atomic_load_n(&g.state, __ATOMIC_ACQUIRE) == 1) return CUDA_SUCCESS;
	pthread_mutex_lock(&g.init_mu);
	int r = g.state == 1 ? CUDA_SUCCESS : g.state == -1 ? g.err : connect_locked();
	pthread_mutex_unlock(&g.init_mu);
	return r;
}

const struct shim_device *shim_device(void) { return g.state == 1 ? &g.dev : NULL; }

int shim_drained(void) {
	if (__atomic_load_n(&g.state, __ATOMIC_ACQUIRE) != 1) return 0;
	pthread_mutex_lock(&g.mu);
	int d = g.state == 1 && g.local_sync && g.drained;
	pthread_mutex_unlock(&g.mu);
	return d;
}

uint64_t shim_max_payload(void) { return g.ring_size / 4; }
uint64_t shim_max_response(void) { return g.resp_size - 4096; }

/* Called with g.mu held: the server is gone. */
static int lost(void) {
	shim_log("connection to the gpuserver lost");
	return fail(CUDA_ERROR_SYSTEM_NOT_READY);
}

static void doorbell(void) {
	char b = 1;
	ssize_t n = send(g.fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
	(void)n; /* a full socket buffer already holds a doorbell */
}

/* publish moves the tail over what was written and wakes the server if it sleeps. */
static void publish(void) {
	__atomic_store_n(CTL(SHIM_CTL_REQ_TAIL, uint64_t), g.tail, __ATOMIC_RELEASE);
	g.published = g.tail;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(CTL(SHIM_CTL_SERVER_WAITING, uint32_t), __ATOMIC_ACQUIRE)) doorbell();
}

/* alive checks the socket without blocking; 0 if the server hung up. Drains doorbells. */
static int alive(void) {
	char buf[64];
	ssize_t n = recv(g.fd, buf, sizeof buf, MSG_DONTWAIT);
	if (n == 0) return 0;
	if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 0;
	return 1;
}

/* wait_room waits until n more bytes fit in the ring. */
static int wait_room(uint64_t n) {
	unsigned spins = 0;
	while (g.tail + n - __atomic_load_n(CTL(SHIM_CTL_REQ_HEAD, uint64_t), __ATOMIC_ACQUIRE) > g.ring_size) {
		if (g.published != g.tail) publish();
		if (++spins % 1024 == 0) {
			if (!alive()) return lost();
			sched_yield();
		} else {
			cpu_relax();
		}
	}
	return 0;
}

int shim_call_begin(struct shim_call *c, unsigned id, int mode, uint64_t payload) {
	int r = shim_connect();
	if (r != 0) return r;
	/* read without the lock: a stale value costs one entry of the log */
	uint64_t t0 = __atomic_load_n(&calllog.on, __ATOMIC_RELAXED) ? now_ns() : 0;
	pthread_mutex_lock(&g.mu);
	g.drained = 0; /* this record may queue work or fail: until its answer says otherwise */
	if (calllog.on) {
		calllog.cur.begin = t0 ? t0 : now_ns();
		calllog.cur.local = __atomic_load_n(&shim_stats.local_calls, __ATOMIC_RELAXED);
		calllog.cur.id = (uint16_t)id;
		calllog.cur.size = (uint32_t)(SHIM_RECORD_HEADER_SIZE + shim_pad8(payload));
		calllog.cur.wait = mode == SHIM_CALL_SYNC || g.sync_all;
	}
	if (g.state != 1) {
		r = g.err;
		pthread_mutex_unlock(&g.mu);
		return r;
	}
	uint64_t size = SHIM_RECORD_HEADER_SIZE + shim_pad8(payload);
	if (size > g.ring_size / 2) {
		pthread_mutex_unlock(&g.mu);
		shim_log("%s: record of %llu bytes exceeds the ring", shim_call_name(id), (unsigned long long)size);
		return CUDA_ERROR_INVALID_VALUE;
	}
	uint64_t pos = g.tail % g.ring_size;
	if (g.ring_size - pos < size) {
		uint64_t pad = g.ring_size - pos;
		if ((r = wait_room(pad)) != 0) {
			pthread_mutex_unlock(&g.mu);
			return r;
		}
		put32(g.ring + pos, (uint32_t)pad);
		put16(g.ring + pos + 4, (uint16_t)SHIM_RECORD_PAD_ID);
		put16(g.ring + pos + 6, 0);
		g.tail += pad;
		pos = 0;
	}
	if ((r = wait_room(size)) != 0) {
		pthread_mutex_unlock(&g.mu);
		return r;
	}
	c->rec = g.ring + pos;
	c->size = size;
	c->off = SHIM_RECORD_HEADER_SIZE;
	c->seq = ++g.seq;
	c->id = id;
	c->wait = mode == SHIM_CALL_SYNC || g.sync_all;
	if (mode == SHIM_CALL_SYNC)
		SHIM_COUNT(sync_calls);
	else
		SHIM_COUNT(async_calls);
	c->resp = NULL;
	c->resp_len = c->roff = 0;
	put32(c->rec, (uint32_t)size);
	put16(c->rec + 4, (uint16_t)id);
	put16(c->rec + 6, c->wait ? (uint16_t)SHIM_RECORD_FLAG_SYNC : 0);
	put64(c->rec + 8, c->seq);
	return 0;
}

void shim_put_u64(struct shim_call *c, uint64_t v) {
	put64(c->rec + c->off, v);
	c->off += 8;
}

void shim_put_bytes(struct shim_call *c, const void *p, uint64_t n) {
	put64(c->rec + c->off, n);
	c->off += 8;
	if (n > 0) memcpy(c->rec + c->off, p, n);
	uint64_t padded = shim_pad8(n);
	if (padded > n) memset(c->rec + c->off + n, 0, padded - n);
	c->off += padded;
}

int shim_call_end(struct shim_call *c) {
	g.tail += c->size;
	publish();
	if (!c->wait) return 0;
	uint64_t *resp_seq = CTL(SHIM_CTL_RESP_SEQ, uint64_t);
	uint32_t *waiting = CTL(SHIM_CTL_CLIENT_WAITING, uint32_t);
	uint64_t start = 0;
	unsigned spins = 0;
	while (__atomic_load_n(resp_seq, __ATOMIC_ACQUIRE) != c->seq) {
		if (++spins % 64 != 0) {
			cpu_relax();
			continue;
		}
		uint64_t t = now_ns();
		if (start == 0) start = t;
		if ((long)(t - start) < g.spin_ns) continue;
		/* Sleep on the socket until the server rings. */
		__atomic_store_n(waiting, 1, __ATOMIC_SEQ_CST);
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		if (__atomic_load_n(resp_seq, __ATOMIC_ACQUIRE) != c->seq) {
			struct pollfd pfd = {.fd = g.fd, .events = POLLIN};
			int pr = poll(&pfd, 1, 1000);
			if (pr > 0 && !alive()) {
				__atomic_store_n(waiting, 0, __ATOMIC_SEQ_CST);
				return lost();
			}
		}
		__atomic_store_n(waiting, 0, __ATOMIC_SEQ_CST);
	}
	const uint8_t *h = g.resp;
	int result = (int)get32(h + 8);
	uint32_t len = get32(h + 12);
	if (len > g.resp_size - SHIM_RESPONSE_HEADER_SIZE) len = 0;
	c->resp = h + SHIM_RESPONSE_HEADER_SIZE;
	c->resp_len = len;
	c->roff = 0;
	if (result == SHIM_RESULT_KERNEL_NOT_SIMULATED) {
		__atomic_add_fetch(&g.not_simulated, 1, __ATOMIC_RELEASE);
		result = CUDA_ERROR_NOT_SUPPORTED;
	}
	if (result == 0) {
		switch (c->id) {
		case CALL_cuCtxSynchronize:
		case CALL_cuStreamSynchronize:
		case CALL_cuStreamQuery:
		case CALL_cuMemcpyDtoH_v2:
		case CALL_cuMemcpyDtoHAsync_v2:
			g.drained = 1;
			break;
		}
	}
	if (result != 0 && shim_debug()) {
		uint16_t id;
		memcpy(&id, c->rec + 4, 2);
		shim_log("%s: the gpuserver answered %d", shim_call_name(id), result);
	}
	return result;
}

uint64_t shim_get_u64(struct shim_call *c) {
	if (c->roff + 8 > c->resp_len) return 0;
	uint64_t v = get64(c->resp + c->roff);
	c->roff += 8;
	return v;
}

float shim_get_f32(struct shim_call *c) {
	uint64_t v = shim_get_u64(c);
	uint32_t bits = (uint32_t)v;
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

void shim_get_bytes(struct shim_call *c, void *dst, uint64_t cap) {
	uint64_t n = shim_get_u64(c);
	if (n > c->resp_len - c->roff) n = c->resp_len - c->roff;
	if (n > cap) n = cap;
	if (n > 0) memcpy(dst, c->resp + c->roff, n);
	c->roff += shim_pad8(n);
}

void shim_call_done(struct shim_call *c) {
	(void)c;
	if (calllog.on && calllog.cur.begin != 0) {
		calllog.cur.end = now_ns();
		if (calllog.n == calllog.cap && calllog.cap < CALLLOG_MAX) {
			size_t cap = calllog.cap ? 2 * calllog.cap : 4096;
			struct calllog_entry *e = realloc(calllog.e, cap * sizeof *e);
			if (e != NULL) {
				calllog.e = e;
				calllog.cap = cap;
			}
		}
		if (calllog.n < calllog.cap) calllog.e[calllog.n++] = calllog.cur;
		calllog.cur.begin = 0;
	}
	pthread_mutex_unlock(&g.mu);
}

/* faas_gpu_session_lost reports whether this process's remoting session ended for good because the server side went
 * away (its tenant's executor process or the gpuserver ended): every CUDA call answers an error from then on. The
 * gpu-python template asks it around each request and exits, so that its supervisor starts it with a new session.
 * Not a CUDA entry point. */
SHIM_EXPORT int faas_gpu_session_lost(void) {
	return __atomic_load_n(&g.state, __ATOMIC_ACQUIRE) == -1 && g.err == CUDA_ERROR_SYSTEM_NOT_READY;
}

/* faas_gpu_kernels_not_simulated is how many calls have failed so far because the simulated node cannot compute a
 * kernel this process launched (the caller got CUDA_ERROR_NOT_SUPPORTED): the gpu-python template compares it
 * around each request and answers 501 naming --sim-kernels=dry instead of the handler's result or exception. Not a
 * CUDA entry point. */
SHIM_EXPORT unsigned long long faas_gpu_kernels_not_simulated(void) {
	return (unsigned long long)__atomic_load_n(&g.not_simulated, __ATOMIC_ACQUIRE);
}

/* faasGpuShimCallLog starts logging every remoted call (path set: the log is written there when it stops) or
 * stops and writes the log (path NULL) as tab-separated lines: begin_ns end_ns call record_bytes wait local_calls
 * (CLOCK_MONOTONIC; local_calls is the shim's count of calls answered in the shim when the call began). It returns
 * 0, or -1 if the log could not be written. For replay traces (test/bench/replay); not a CUDA entry point. */
SHIM_EXPORT int faasGpuShimCallLog(const char *path) {
	pthread_mutex_lock(&g.mu);
	int r = 0;
	if (path != NULL) {
		snprintf(calllog.path, sizeof calllog.path, "%s", path);
		calllog.n = 0;
		calllog.cur.begin = 0;
		__atomic_store_n(&calllog.on, 1, __ATOMIC_RELAXED);
	} else if (calllog.on) {
		__atomic_store_n(&calllog.on, 0, __ATOMIC_RELAXED);
		FILE *f = fopen(calllog.path, "w");
		if (f == NULL) {
			r = -1;
		} else {
			fprintf(f, "# begin_ns\tend_ns\tcall\trecord_bytes\twait\tlocal_calls\n");
			for (size_t i = 0; i < calllog.n; i++) {
				const struct calllog_entry *e = &calllog.e[i];
				fprintf(f, "%llu\t%llu\t%s\t%u\t%u\t%llu\n", (unsigned long long)e->begin,
					(unsigned long long)e->end, shim_call_name(e->id), e->size, e->wait,
					(unsigned long long)e->local);
			}
			if (fclose(f) != 0) r = -1;
		}
		calllog.n = 0;
	}
	pthread_mutex_unlock(&g.mu);
	return r;
}
