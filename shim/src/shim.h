/*
 * shim.h: the runtime of the faas-gpu shim, a replacement libcuda.so.1 that forwards the CUDA driver API to the
 * gpuserver over a Unix socket (control) and a shared-memory ring (call records and bulk data).
 * No CUDA headers: results are int (CUresult), handles are void *, device pointers unsigned long long.
 */
#ifndef FAAS_GPU_SHIM_H
#define FAAS_GPU_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "calls_gen.h"

#define SHIM_EXPORT __attribute__((visibility("default")))
#define SHIM_HIDDEN __attribute__((visibility("hidden")))

/* CUDA results the shim produces itself (values of CUresult). */
enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_DEINITIALIZED = 4,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_IMAGE = 200,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_ILLEGAL_ADDRESS = 700,
	CUDA_ERROR_LAUNCH_FAILED = 719,
	CUDA_ERROR_NOT_PERMITTED = 800,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_SYSTEM_NOT_READY = 802,
	CUDA_ERROR_ILLEGAL_STATE = 401,
	CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
	CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
	CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
	CUDA_ERROR_UNKNOWN = 999,
};

/* faas-gpu's own result, never a CUDA one (the gpuserver's remoting.ResultKernelNotSimulated): the simulated node
 * cannot compute the kernel a launch named. shim_call_end hands the caller CUDA_ERROR_NOT_SUPPORTED in its place
 * and counts it (faas_gpu_kernels_not_simulated). */
#define SHIM_RESULT_KERNEL_NOT_SIMULATED 0x46470001

/* CU_DEVICE_ATTRIBUTE_MAX of CUDA 13.0: device attributes are 1..147. */
#define SHIM_DEVICE_ATTRIBUTE_MAX 148

/* The CUDA version the shim reports (cuDriverGetVersion): 13.0. */
#define SHIM_DRIVER_VERSION 13000

enum { SHIM_CALL_SYNC = 1, SHIM_CALL_ASYNC = 0 };

/* One call in flight: the record being written, then the response being read. The connection lock is held from
 * shim_call_begin to shim_call_done. */
struct shim_call {
	uint8_t *rec;    /* record in the ring */
	size_t size;     /* record size */
	size_t off;      /* write offset in the record */
	const uint8_t *resp;
	size_t resp_len;
	size_t roff;
	uint64_t seq;
	int wait;        /* 1 if a response is awaited */
	unsigned id;     /* the call (enum shim_call_id) */
};

static inline uint64_t shim_pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

/* Connects on first use; returns a CUresult. */
int shim_call_begin(struct shim_call *c, unsigned id, int mode, uint64_t payload);
void shim_put_u64(struct shim_call *c, uint64_t v);
void shim_put_bytes(struct shim_call *c, const void *p, uint64_t n);
/* Publishes the record; for a call that waits, waits for its response and returns its result. */
int shim_call_end(struct shim_call *c);
uint64_t shim_get_u64(struct shim_call *c);
float shim_get_f32(struct shim_call *c);
/* Copies at most cap bytes of the next out-bytes field into dst. */
void shim_get_bytes(struct shim_call *c, void *dst, uint64_t cap);
void shim_call_done(struct shim_call *c);

/* Largest payload one record can carry (bulk copies are chunked to it), and largest out-bytes of one response. */
uint64_t shim_max_payload(void);
uint64_t shim_max_response(void);
/* The host bytes one record carries: the payload less room for the call's other arguments (copy.c). */
uint64_t shim_chunk_size(void);

/* Ensures the connection (cuInit); returns a CUresult. */
int shim_connect(void);

/* shim_drained says whether the last record the process sent was a call that waited for all of the function's
 * earlier work on the gpuserver (cuCtxSynchronize, cuStreamSynchronize, cuStreamQuery, or a device-to-host copy:
 * the gpuserver runs every stream of a session in order on one device stream, and each of these synchronizes it)
 * and succeeded. Then nothing is queued that a synchronize could wait for, and no error of earlier async work is
 * pending: the gpuserver reports one at the first synchronising call after it, and that call answered success. Any
 * record sent since (async or not, by any thread) clears it, and so does a failed answer. (transport.c) */
int shim_drained(void);

/* Logging: every message is prefixed "faas-gpu shim: ". shim_unsupported logs each name once. */
void shim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int shim_unsupported(const char *name);
int shim_null_arg(const char *call, const char *arg);
int shim_debug(void);

/* Device information from the hello reply (valid after shim_connect succeeded). */
struct shim_device {
	char name[256];
	uint8_t uuid[16];
	uint64_t total_mem;
	uint64_t va_base, va_size;
	int attrs[SHIM_ATTR_COUNT];
};
const struct shim_device *shim_device(void);

/* Kernel parameter layouts by function handle (filled by cuModuleGetFunction / cuKernelGetFunction). */
struct shim_params {
	uint32_t count;
	uint32_t offset[SHIM_PARAM_MAX];
	uint32_t size[SHIM_PARAM_MAX];
};
const struct shim_params *shim_params_get(void *func);

/* CUlaunchConfig as cuda.h lays it out on 64-bit platforms (cuLaunchKernelEx, cuOccupancyMaxActiveClusters), and
 * the size of one CUlaunchAttribute: u32 id, 4 bytes of padding, a 64-byte value. */
struct shim_launch_config {
	unsigned grid[3];
	unsigned block[3];
	unsigned shmem;
	void *stream;
	const uint8_t *attrs; /* CUlaunchAttribute[num_attrs] */
	unsigned num_attrs;
};
#define SHIM_LAUNCH_ATTR_SIZE 72
/* A function attribute (CUfunction_attribute), cached (func.c). */
int shim_func_attr(void *func, int attribute, int *value);

/* The entry point of an exported symbol (procaddr.c), NULL if none. */
void *shim_symbol(const char *symbol);
/* The variant of base current at a CUDA version (cuGetProcAddress); status is a CUdriverProcAddressQueryResult. */
const struct shim_variant *shim_resolve(const char *base, int version, int per_thread, int *status);

/* Private tables of cuGetExportTable (exports.c), by index. */
enum shim_table {
	SHIM_TABLE_CUDART_INTERFACE,
	SHIM_TABLE_TOOLS_TLS,
	SHIM_TABLE_TOOLS_RUNTIME_CALLBACK_HOOKS,
	SHIM_TABLE_CONTEXT_LOCAL_STORAGE,
	SHIM_TABLE_DEVICE_EXTENDED_RT,
	SHIM_TABLE_INTEGRITY_CHECK,
	SHIM_TABLE_CONTEXT_CHECKS,
	SHIM_TABLE_CTX_CREATE_BYPASS,
	SHIM_TABLE_HEAP_ACCESS,
	SHIM_TABLE_TOOLS_CONTEXT_ID,
	SHIM_TABLE_PRE_INIT,
	SHIM_TABLE_69A28E9F,
	SHIM_TABLE_1734DC26,
	SHIM_TABLE_KNOWN, /* tables from here on are stub tables handed out for UUIDs the shim does not know */
};
/* The table handed out for a known table (NULL for an index without one). */
const void *shim_export_table(enum shim_table t);

/* MD2 (RFC 1319) fed a byte at a time, its 66 bytes laid out as X[48], C[16], byte count, L (integrity.c). */
struct shim_md2 {
	uint8_t x[48];
	uint8_t c[16];
	uint8_t n;
	uint8_t l;
};
void shim_md2_init(struct shim_md2 *m);
void shim_md2_byte(struct shim_md2 *m, uint8_t b);
/* Feeds len bytes of p, each XORed with mask. */
void shim_md2_update(struct shim_md2 *m, const void *p, size_t len, uint8_t mask);
void shim_md2_final(struct shim_md2 *m, uint8_t digest[16]);
/* The integrity check's HMAC-MD2: begin feeds the inner key block, end finishes inner and outer hashes. */
void shim_integrity_begin(struct shim_md2 *m);
void shim_integrity_end(struct shim_md2 *m, uint64_t out[2]);
/* fn is the address of the table slot the caller called (it is part of the message). */
int shim_integrity_check(unsigned version, uint64_t unix_seconds, uint64_t out[2], const void *fn);

/* Stream capture state (stream.c; CUstreamCaptureStatus values), set by graph.c. begin fails with
 * CUDA_ERROR_ILLEGAL_STATE on a stream already capturing, end on one that is not. invalidate marks every active
 * capture invalidated (a call the capture cannot hold failed). */
enum { SHIM_CAPTURE_NONE = 0, SHIM_CAPTURE_ACTIVE = 1, SHIM_CAPTURE_INVALIDATED = 2 };
int shim_stream_capture_begin(void *h, int mode);
int shim_stream_capture_end(void *h);
void shim_stream_capture_invalidate(void);
int shim_stream_capture_status(void *h, int *status, uint64_t *id);
/* Whether any stream is capturing (its capture active or invalidated and not yet ended). */
int shim_stream_capturing(void);

/* Whether an address is device memory of the function (alloc.c). */
int shim_device_address(uint64_t p);

/* The size of a module image (PTX text, cubin, fat binary or its wrapper) and where it starts (module.c). */
size_t shim_image_size(const void *image, const void **start);

/* Module loading from any image the driver accepts (PTX, cubin, fatbin, fatbin wrapper): module.c. */
int shim_module_load(void **module, const void *image);
/* The process's one context (local.c), and the destruction of its context-local storage (exports.c). */
void *shim_primary_ctx(void);
void *shim_current_ctx(void);
void shim_context_storage_destroy(void *ctx);

/* Counters of what the shim did, for tests and the remoted-calls report (faasGpuShimStats). */
struct shim_stats {
	uint64_t sync_calls;     /* remoted calls the caller waited for */
	uint64_t async_calls;    /* remoted fire-and-forget calls */
	uint64_t local_calls;    /* entry points and table slots answered in the shim */
	uint64_t unsupported;    /* calls of stub entry points (NOT_SUPPORTED) */
	uint64_t unknown_slots;  /* calls of private-table slots the shim does not emulate */
	uint64_t syncs_answered; /* synchronizations answered in the shim (shim_drained; also counted in local_calls) */
};
extern struct shim_stats shim_stats;
#define SHIM_COUNT(field) __atomic_add_fetch(&shim_stats.field, 1, __ATOMIC_RELAXED)
#define SHIM_LOCAL() SHIM_COUNT(local_calls)

#endif
