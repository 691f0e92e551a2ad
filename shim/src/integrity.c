/*
 * integrity.c: the runtime's integrity check (private table d4082055-bde6-704b-8d34-ba123c66e1f2, slot 1).
 *
 * cudart calls check(version, unix_seconds, out[2]) and compares the answer with its own computation, so the
 * answer must be computed in this process from exactly what the shim reports elsewhere. For version % 10 of 0 or
 * 1 the driver answers constants; otherwise the answer is HMAC-MD2 (RFC 1319 MD2, RFC 2104 HMAC with MD2's
 * 16-byte block) under a fixed key of the message:
 *
 *   u32 driver version (cuDriverGetVersion), u32 version, u32 pid, u32 low 32 bits of pthread_self(),
 *   the addresses of the CUDART_INTERFACE table, of this table and of the slot function, u64 unix_seconds,
 *   then per device (cuDeviceGetCount): its UUID (cuDeviceGetUuid), PCI domain, bus and device (i32 each,
 *   cuDeviceGetAttribute).
 *
 * The MD2 state is kept as one 66-byte block (the 48-byte buffer X, the 16-byte checksum C, the byte count of
 * the current block and the checksum's running byte L), fed one byte at a time, so that published intermediate
 * vectors of this computation (vosen/ZLUDA dark_api) can be checked against it (shim/test/test_shim.c).
 */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

/* MD2's substitution table: a permutation of 0..255 built from the digits of pi (RFC 1319, section 3.2). */
static const uint8_t S[256] = {
	41,  46,  67,  201, 162, 216, 124, 1,   61,  54,  84,  161, 236, 240, 6,   19,  98,  167, 5,   243, 192, 199,
	115, 140, 152, 147, 43,  217, 188, 76,  130, 202, 30,  155, 87,  60,  253, 212, 224, 22,  103, 66,  111, 24,
	138, 23,  229, 18,  190, 78,  196, 214, 218, 158, 222, 73,  160, 251, 245, 142, 187, 47,  238, 122, 169, 104,
	121, 145, 21,  178, 7,   63,  148, 194, 16,  137, 11,  34,  95,  33,  128, 127, 93,  154, 90,  144, 50,  39,
	53,  62,  204, 231, 191, 247, 151, 3,   255, 25,  48,  179, 72,  165, 181, 209, 215, 94,  146, 42,  172, 86,
	170, 198, 79,  184, 56,  210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4,   241, 69,  157, 112, 89,
	100, 113, 135, 32,  134, 91,  207, 101, 230, 45,  168, 2,   27,  96,  37,  173, 174, 176, 185, 246, 28,  70,
	97,  105, 52,  64,  126, 15,  85,  71,  163, 35,  221, 81,  175, 58,  195, 92,  249, 206, 186, 197, 234, 38,
	44,  83,  13,  110, 133, 40,  132, 9,   211, 223, 205, 244, 65,  129, 77,  82,  106, 220, 55,  200, 108, 193,
	171, 250, 36,  225, 123, 8,   12,  189, 177, 74,  120, 136, 149, 139, 227, 99,  232, 109, 233, 203, 213, 254,
	59,  0,   29,  57,  242, 239, 183, 14,  102, 88,  208, 228, 166, 119, 114, 248, 235, 117, 75,  10,  49,  68,
	80,  180, 143, 237, 31,  26,  219, 153, 141, 51,  159, 17,  131, 20,
};

void shim_md2_init(struct shim_md2 *m) { memset(m, 0, sizeof *m); }

static void md2_compress(struct shim_md2 *m) {
	uint8_t t = 0;
	for (int j = 0; j < 18; j++) {
		for (int k = 0; k < 48; k++) t = m->x[k] ^= S[t];
		t = (uint8_t)(t + j);
	}
}

void shim_md2_byte(struct shim_md2 *m, uint8_t b) {
	uint8_t i = m->n;
	m->x[16 + i] = b;
	m->x[32 + i] = m->x[i] ^ b;
	m->l = m->c[i] ^= S[b ^ m->l];
	m->n = (i + 1) & 15;
	if (m->n == 0) md2_compress(m);
}

void shim_md2_update(struct shim_md2 *m, const void *p, size_t len, uint8_t mask) {
	const uint8_t *b = p;
	for (size_t i = 0; i < len; i++) shim_md2_byte(m, b[i] ^ mask);
}

void shim_md2_final(struct shim_md2 *m, uint8_t digest[16]) {
	uint8_t pad = (uint8_t)(16 - m->n);
	for (int i = 0; i < pad; i++) shim_md2_byte(m, pad);
	uint8_t sum[16];
	memcpy(sum, m->c, 16);
	shim_md2_update(m, sum, 16, 0);
	memcpy(digest, m->x, 16);
}

/* The HMAC key (16 bytes: MD2's block). */
static const uint8_t key[16] = {0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52,
				0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f};

void shim_integrity_begin(struct shim_md2 *m) {
	shim_md2_init(m);
	shim_md2_update(m, key, sizeof key, 0x36);
}

void shim_integrity_end(struct shim_md2 *m, uint64_t out[2]) {
	uint8_t inner[16], outer[16];
	shim_md2_final(m, inner);
	shim_md2_init(m);
	shim_md2_update(m, key, sizeof key, 0x5c);
	shim_md2_update(m, inner, sizeof inner, 0);
	shim_md2_final(m, outer);
	memcpy(out, outer, 16);
}

/* CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, _PCI_DEVICE_ID, _PCI_DOMAIN_ID */
enum { ATTR_PCI_BUS = 33, ATTR_PCI_DEVICE = 34, ATTR_PCI_DOMAIN = 50 };

int cuDriverGetVersion(int *);
int cuDeviceGetCount(int *);
int cuDeviceGet(int *, int);
int cuDeviceGetUuid_v2(void *, int);
int cuDeviceGetAttribute(int *, int, int);

SHIM_HIDDEN int shim_integrity_check(unsigned version, uint64_t unix_seconds, uint64_t out[2], const void *fn) {
	if (out == NULL) return CUDA_ERROR_INVALID_VALUE;
	switch (version % 10) {
	case 0:
		out[0] = 0x3341181c03cb675cull;
		out[1] = 0x8ed383aa1f4cd1e8ull;
		return CUDA_SUCCESS;
	case 1:
		out[0] = 0x1841181c03cb675cull;
		out[1] = 0x8ed383aa1f4cd1e8ull;
		return CUDA_SUCCESS;
	}
	struct {
		uint32_t driver_version, version, pid, thread;
		const void *cudart_table, *integrity_table, *fn;
		uint64_t unix_seconds;
	} in;
	memset(&in, 0, sizeof in);
	int dv = 0, count = 0, r;
	if ((r = cuDriverGetVersion(&dv)) != 0 || (r = cuDeviceGetCount(&count)) != 0) return r;
	in.driver_version = (uint32_t)dv;
	in.version = version;
	in.pid = (uint32_t)getpid();
	in.thread = (uint32_t)(uintptr_t)pthread_self();
	in.cudart_table = shim_export_table(SHIM_TABLE_CUDART_INTERFACE);
	in.integrity_table = shim_export_table(SHIM_TABLE_INTEGRITY_CHECK);
	in.fn = fn;
	in.unix_seconds = unix_seconds;
	struct shim_md2 m;
	shim_integrity_begin(&m);
	shim_md2_update(&m, &in, sizeof in, 0);
	for (int i = 0; i < count; i++) {
		struct {
			uint8_t uuid[16];
			int32_t domain, bus, device;
		} d;
		int dev;
		if ((r = cuDeviceGet(&dev, i)) != 0 || (r = cuDeviceGetUuid_v2(d.uuid, dev)) != 0 ||
		    (r = cuDeviceGetAttribute(&d.domain, ATTR_PCI_DOMAIN, dev)) != 0 ||
		    (r = cuDeviceGetAttribute(&d.bus, ATTR_PCI_BUS, dev)) != 0 ||
		    (r = cuDeviceGetAttribute(&d.device, ATTR_PCI_DEVICE, dev)) != 0)
			return r;
		shim_md2_update(&m, &d, sizeof d, 0);
	}
	shim_integrity_end(&m, out);
	if (shim_debug())
		shim_log("integrity check (version %u, time %llu, driver %d, pid %u, thread %#x, %d device(s)): %016llx %016llx",
			 version, (unsigned long long)unix_seconds, dv, in.pid, in.thread, count,
			 (unsigned long long)out[0], (unsigned long long)out[1]);
	return CUDA_SUCCESS;
}
