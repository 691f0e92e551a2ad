/*
 * stream.c: what the shim knows about the function's streams without asking the gpuserver. Streams are created
 * remotely (their handles are the gpuserver's); their flags, priority, id and attributes are kept here, so the
 * queries PyTorch and cuBLAS make around every operation (capture state, flags, priority, context, device) cost no
 * round trip. Capture state (CUDA graphs, graph.c) is kept here too, so that the capture queries PyTorch's allocator
 * makes before every allocation report the real state without a round trip. Host functions run on the calling thread once the
 * stream's earlier work has completed (all of a session's streams run in order on the gpuserver).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define STREAM_LEGACY ((void *)0x1)
#define STREAM_PER_THREAD ((void *)0x2)
#define ATTRS 17 /* CUlaunchAttributeID values a stream attribute can take (1..16) */

struct stream {
	void *handle;
	unsigned flags;
	int priority;
	uint64_t id;
	uint8_t attr[ATTRS][64];
	int capture_status; /* CUstreamCaptureStatus: none, active, invalidated */
	int capture_mode;
	uint64_t capture_id;
	struct stream *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct stream *streams;
static struct stream defaults[3] = {{.handle = NULL, .id = 0}, {.handle = STREAM_LEGACY, .id = 1},
				    {.handle = STREAM_PER_THREAD, .id = 2}};
static uint64_t next_id = 16;

/* get returns the stream of handle h (NULL if unknown). Called with mu held. */
static struct stream *get(void *h) {
	if (h == NULL || h == STREAM_LEGACY || h == STREAM_PER_THREAD) return &defaults[(uintptr_t)h];
	for (struct stream *s = streams; s != NULL; s = s->next)
		if (s->handle == h) return s;
	return NULL;
}

static int remember(void *h, unsigned flags, int priority) {
	struct stream *s = calloc(1, sizeof *s);
	if (s == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
	s->handle = h;
	s->flags = flags;
	s->priority = priority;
	memcpy(s->attr[8], &priority, sizeof priority); /* CU_LAUNCH_ATTRIBUTE_PRIORITY */
	pthread_mutex_lock(&mu);
	s->id = next_id++;
	s->next = streams;
	streams = s;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuStreamCreate(void **phStream, unsigned int flags) {
	int r = rpc_cuStreamCreate(phStream, flags);
	return r == 0 ? remember(*phStream, flags, 0) : r;
}

SHIM_EXPORT int cuStreamCreateWithPriority(void **phStream, unsigned int flags, int priority) {
	int r = rpc_cuStreamCreateWithPriority(phStream, flags, priority);
	/* The device's range is [-5, 0] (cuCtxGetStreamPriorityRange); the driver clamps. */
	if (priority < -5) priority = -5;
	if (priority > 0) priority = 0;
	return r == 0 ? remember(*phStream, flags, priority) : r;
}

SHIM_EXPORT int cuStreamDestroy_v2(void *h) {
	int r = rpc_cuStreamDestroy_v2(h);
	if (r != 0) return r;
	pthread_mutex_lock(&mu);
	for (struct stream **p = &streams; *p != NULL; p = &(*p)->next) {
		if ((*p)->handle == h) {
			struct stream *s = *p;
			*p = s->next;
			free(s);
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

/* with runs f on the stream of handle h under the lock. */
#define WITH_STREAM(h, s, body)                                                                                  \
	do {                                                                                                     \
		pthread_mutex_lock(&mu);                                                                         \
		struct stream *s = get(h);                                                                       \
		if (s == NULL) {                                                                                 \
			pthread_mutex_unlock(&mu);                                                               \
			return CUDA_ERROR_INVALID_HANDLE;                                                        \
		}                                                                                                \
		body;                                                                                            \
		pthread_mutex_unlock(&mu);                                                                       \
	} while (0)

SHIM_EXPORT int cuStreamGetFlags(void *h, unsigned int *flags) {
	SHIM_LOCAL();
	if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
	WITH_STREAM(h, s, *flags = s->flags);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuStreamGetPriority(void *h, int *priority) {
	SHIM_LOCAL();
	if (priority == NULL) return CUDA_ERROR_INVALID_VALUE;
	WITH_STREAM(h, s, *priority = s->priority);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuStreamGetId(void *h, unsigned long long *id) {
	SHIM_LOCAL();
	if (id == NULL) return CUDA_ERROR_INVALID_VALUE;
	WITH_STREAM(h, s, *id = s->id);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuStreamGetCtx(void *h, void **pctx) {
	SHIM_LOCAL();
	if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
	WITH_STREAM(h, s, (void)s);
	*pctx = shim_primary_ctx();
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuStreamGetCtx_v2(void *h, void **pctx, void **pGreenCtx) {
	int r = cuStreamGetCtx(h, pctx);
	if (r == 0 && pGreenCtx != NULL) *pGreenCtx = NULL; /* no green contexts */
	return r;
}

SHIM_EXPORT int cuStreamGetDevice(void *h, int *device) {
	SHIM_LOCAL();
	if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
	WITH_STREAM(h, s, (void)s);
	*device = 0;
	return CUDA_SUCCESS;
}

/* ---- capture: the state graph.c sets at cuStreamBeginCapture and cuStreamEndCapture */

static uint64_t next_capture_id = 1;

int shim_stream_capture_begin(void *h, int mode) {
	int r = CUDA_SUCCESS;
	pthread_mutex_lock(&mu);
	struct stream *s = get(h);
	if (s == NULL)
		r = CUDA_ERROR_INVALID_HANDLE;
	else if (s->capture_status != SHIM_CAPTURE_NONE)
		r = CUDA_ERROR_ILLEGAL_STATE;
	else {
		s->capture_status = SHIM_CAPTURE_ACTIVE;
		s->capture_mode = mode;
		s->capture_id = next_capture_id++;
	}
	pthread_mutex_unlock(&mu);
	return r;
}

int shim_stream_capture_end(void *h) {
	int r = CUDA_SUCCESS;
	pthread_mutex_lock(&mu);
	struct stream *s = get(h);
	if (s == NULL)
		r = CUDA_ERROR_INVALID_HANDLE;
	else if (s->capture_status == SHIM_CAPTURE_NONE)
		r = CUDA_ERROR_ILLEGAL_STATE;
	else
		s->capture_status = SHIM_CAPTURE_NONE;
	pthread_mutex_unlock(&mu);
	return r;
}

void shim_stream_capture_invalidate(void) {
	pthread_mutex_lock(&mu);
	for (struct stream *s = streams; s != NULL; s = s->next)
		if (s->capture_status == SHIM_CAPTURE_ACTIVE) s->capture_status = SHIM_CAPTURE_INVALIDATED;
	for (int i = 0; i < 3; i++)
		if (defaults[i].capture_status == SHIM_CAPTURE_ACTIVE) defaults[i].capture_status = SHIM_CAPTURE_INVALIDATED;
	pthread_mutex_unlock(&mu);
}

int shim_stream_capture_status(void *h, int *status, uint64_t *id) {
	pthread_mutex_lock(&mu);
	struct stream *s = get(h);
	if (s != NULL) {
		*status = s->capture_status;
		*id = s->capture_id;
	}
	pthread_mutex_unlock(&mu);
	return s == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

SHIM_EXPORT int cuStreamIsCapturing(void *h, int *status) {
	SHIM_LOCAL();
	if (status == NULL) return CUDA_ERROR_INVALID_VALUE;
	uint64_t id;
	return shim_stream_capture_status(h, status, &id);
}

SHIM_EXPORT int cuStreamGetCaptureInfo_v3(void *h, int *status, unsigned long long *id, void **graph,
					  const void **deps, const void **edges, size_t *ndeps) {
	SHIM_LOCAL();
	if (status == NULL) return CUDA_ERROR_INVALID_VALUE;
	uint64_t cid = 0;
	int r = shim_stream_capture_status(h, status, &cid);
	if (r != 0) return r;
	/* The graph is the gpuserver's until the capture ends: no handle, and the recorded work runs in order, so
	 * the dependencies of the next node are the whole capture so far (none to name). */
	if (id != NULL) *id = *status == SHIM_CAPTURE_NONE ? 0 : cid;
	if (graph != NULL) *graph = NULL;
	if (deps != NULL) *deps = NULL;
	if (edges != NULL) *edges = NULL;
	if (ndeps != NULL) *ndeps = 0;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuStreamGetCaptureInfo_v2(void *h, int *status, unsigned long long *id, void **graph,
					  const void **deps, size_t *ndeps) {
	return cuStreamGetCaptureInfo_v3(h, status, id, graph, deps, NULL, ndeps);
}

static __thread int capture_mode; /* CU_STREAM_CAPTURE_MODE_GLOBAL */

SHIM_EXPORT int cuThreadExchangeStreamCaptureMode(int *mode) {
	SHIM_LOCAL();
	if (mode == NULL) return CUDA_ERROR_INVALID_VALUE;
	int old = capture_mode;
	capture_mode = *mode;
	*mode = old;
	return CUDA_SUCCESS;
}

/* ---- attributes (CUstreamAttrValue is the 64-byte CUlaunchAttributeValue) */

SHIM_EXPORT int cuStreamGetAttribute(void *h, int attr, void *value) {
	SHIM_LOCAL();
	if (value == NULL || attr <= 0 || attr >= ATTRS) return CUDA_ERROR_INVALID_VALUE;
	WITH_STREAM(h, s, memcpy(value, s->attr[attr], 64));
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuStreamSetAttribute(void *h, int attr, const void *value) {
	SHIM_LOCAL();
	if (value == NULL || attr <= 0 || attr >= ATTRS) return CUDA_ERROR_INVALID_VALUE;
	WITH_STREAM(h, s, memcpy(s->attr[attr], value, 64));
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuStreamCopyAttributes(void *dst, void *src) {
	SHIM_LOCAL();
	pthread_mutex_lock(&mu);
	struct stream *d = get(dst), *s = get(src);
	if (d != NULL && s != NULL) memcpy(d->attr, s->attr, sizeof d->attr);
	pthread_mutex_unlock(&mu);
	return d != NULL && s != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

int shim_stream_capturing(void) {
	int c = 0;
	pthread_mutex_lock(&mu);
	for (struct stream *s = streams; s != NULL && !c; s = s->next) c = s->capture_status != SHIM_CAPTURE_NONE;
	for (int i = 0; i < 3 && !c; i++) c = defaults[i].capture_status != SHIM_CAPTURE_NONE;
	pthread_mutex_unlock(&mu);
	return c;
}

/* ---- synchronisation. A synchronize that follows a completed device-to-host copy (the way PyTorch reads a
 * value: cuMemcpyDtoHAsync then cuStreamSynchronize) has nothing left to wait for when no record was sent since:
 * it is answered here, without a round trip (shim_drained says when). It goes to the gpuserver whenever the answer
 * could differ: after any record since the last completed synchronization (an async launch or copy on any stream,
 * or any other call), after a synchronization or copy that failed (the gpuserver then answers what it knows: a
 * sticky fault again, a one-shot error of an async call never twice), for a stream handle the shim does not know
 * (the gpuserver says CUDA_ERROR_INVALID_HANDLE), and while a stream captures (the gpuserver refuses it and the
 * capture is invalidated). */

/* answered says whether a synchronize of stream h (any stream when all) is answered here. */
static int answered(void *h, int all) {
	if (!all) {
		pthread_mutex_lock(&mu);
		struct stream *s = get(h);
		pthread_mutex_unlock(&mu);
		if (s == NULL) return 0;
	}
	if (shim_stream_capturing() || !shim_drained()) return 0;
	SHIM_LOCAL();
	SHIM_COUNT(syncs_answered);
	return 1;
}

SHIM_EXPORT int cuStreamSynchronize(void *h) {
	if (answered(h, 0)) return CUDA_SUCCESS;
	return rpc_cuStreamSynchronize(h);
}

/* The gpuserver answers a query once the stream's work has completed (it waits): answered here like a synchronize. */
SHIM_EXPORT int cuStreamQuery(void *h) {
	if (answered(h, 0)) return CUDA_SUCCESS;
	return rpc_cuStreamQuery(h);
}

SHIM_EXPORT int cuCtxSynchronize(void) {
	if (answered(NULL, 1)) return CUDA_SUCCESS;
	return rpc_cuCtxSynchronize();
}

/* ---- host functions */

SHIM_EXPORT int cuLaunchHostFunc(void *h, void (*fn)(void *), void *userData) {
	if (fn == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = cuStreamSynchronize(h);
	if (r != 0) return r;
	fn(userData);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuStreamAddCallback(void *h, void (*cb)(void *, int, void *), void *userData, unsigned int flags) {
	if (cb == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
	int r = cuStreamSynchronize(h);
	cb(h, r, userData);
	return CUDA_SUCCESS;
}

/* ---- stream memory operations: writes go in order with the stream's work; a wait is checked once the
 * stream's earlier work has completed (gpuserver/remoting/copy2d.go: the session's streams run in order, so a
 * condition that does not hold then never will and the wait answers CUDA_ERROR_ILLEGAL_STATE). */

SHIM_EXPORT int cuStreamWriteValue32_v2(void *h, unsigned long long addr, uint32_t value, unsigned int flags) {
	return rpc_streamWriteValue(h, addr, value, 4, flags);
}

SHIM_EXPORT int cuStreamWriteValue64_v2(void *h, unsigned long long addr, uint64_t value, unsigned int flags) {
	return rpc_streamWriteValue(h, addr, value, 8, flags);
}

SHIM_EXPORT int cuStreamWaitValue32_v2(void *h, unsigned long long addr, uint32_t value, unsigned int flags) {
	return rpc_streamWaitValue(h, addr, value, 4, flags);
}

SHIM_EXPORT int cuStreamWaitValue64_v2(void *h, unsigned long long addr, uint64_t value, unsigned int flags) {
	return rpc_streamWaitValue(h, addr, value, 8, flags);
}

/* CUstreamBatchMemOpParams: 48 bytes; u32 operation, then (waits and writes) u64 address at 8, the value at 16,
 * u32 flags at 24. */
enum { OP_WAIT_32 = 1, OP_WRITE_32 = 2, OP_FLUSH_REMOTE_WRITES = 3, OP_WAIT_64 = 4, OP_WRITE_64 = 5, OP_BARRIER = 6 };

SHIM_EXPORT int cuStreamBatchMemOp_v2(void *h, unsigned int count, const uint8_t *params, unsigned int flags) {
	if (flags != 0 || (count > 0 && params == NULL)) return CUDA_ERROR_INVALID_VALUE;
	for (unsigned i = 0; i < count; i++) {
		const uint8_t *p = params + 48 * (size_t)i;
		uint32_t op, f;
		uint64_t addr, v64;
		uint32_t v32;
		memcpy(&op, p, 4);
		memcpy(&addr, p + 8, 8);
		memcpy(&v32, p + 16, 4);
		memcpy(&v64, p + 16, 8);
		memcpy(&f, p + 24, 4);
		int r;
		switch (op) {
		case OP_WAIT_32: r = cuStreamWaitValue32_v2(h, addr, v32, f); break;
		case OP_WRITE_32: r = cuStreamWriteValue32_v2(h, addr, v32, f); break;
		case OP_WAIT_64: r = cuStreamWaitValue64_v2(h, addr, v64, f); break;
		case OP_WRITE_64: r = cuStreamWriteValue64_v2(h, addr, v64, f); break;
		case OP_FLUSH_REMOTE_WRITES: /* no remote writers: the function's memory is its own */
		case OP_BARRIER:            /* the stream's operations already run in order */
			SHIM_LOCAL();
			r = CUDA_SUCCESS;
			break;
		default: r = CUDA_ERROR_INVALID_VALUE;
		}
		if (r != 0) return r;
	}
	return CUDA_SUCCESS;
}
