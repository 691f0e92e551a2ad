/*
 * occupancy.c: the occupancy queries (cuOccupancy*), computed in the shim from the kernel's attributes (registers,
 * static shared memory, block size limit: cached after the first read) and the device's attribute table, with the
 * occupancy calculator's rules: a block takes its threads rounded up to whole warps, its registers per warp
 * rounded up to the 256-register allocation unit, and its shared memory (static + dynamic + the per-block
 * reservation) rounded up to the 128-byte allocation unit; an SM runs as many blocks as its threads, registers,
 * shared memory and block slots allow. The user's callback of cuOccupancyMaxPotentialBlockSize runs in this
 * process, as it must.
 */
#include <stddef.h>
#include <string.h>

#include "shim.h"

/* CUdevice_attribute and CUfunction_attribute values used here. */
enum {
	DA_MAX_THREADS_PER_BLOCK = 1,
	DA_MAX_REGISTERS_PER_BLOCK = 12,
	DA_WARP_SIZE = 10,
	DA_MULTIPROCESSOR_COUNT = 16,
	DA_MAX_THREADS_PER_SM = 39,
	DA_MAX_SHARED_PER_SM = 81,
	DA_MAX_REGISTERS_PER_SM = 82,
	DA_MAX_SHARED_PER_BLOCK_OPTIN = 97,
	DA_MAX_BLOCKS_PER_SM = 106,
	DA_RESERVED_SHARED_PER_BLOCK = 111,
	DA_CLUSTER_LAUNCH = 120,
};
enum { FA_MAX_THREADS_PER_BLOCK = 0, FA_SHARED_SIZE_BYTES = 1, FA_NUM_REGS = 4, FA_NON_PORTABLE_CLUSTER = 14 };

#define REG_ALLOC_UNIT 256
#define SHARED_ALLOC_UNIT 128
#define SM_PARTITIONS 4

struct kernel_limits {
	int max_threads, regs, static_shared;
};

static int limits(void *f, struct kernel_limits *k) {
	int r;
	if ((r = shim_func_attr(f, FA_MAX_THREADS_PER_BLOCK, &k->max_threads)) != 0 ||
	    (r = shim_func_attr(f, FA_NUM_REGS, &k->regs)) != 0 ||
	    (r = shim_func_attr(f, FA_SHARED_SIZE_BYTES, &k->static_shared)) != 0)
		return r;
	return CUDA_SUCCESS;
}

static int attr(const struct shim_device *d, int a) { return d->attrs[a]; }

static long round_up(long x, long unit) { return (x + unit - 1) / unit * unit; }

/* blocks_per_sm is the number of blocks of blockSize threads and dynamic shared memory smem one SM runs at once. */
static int blocks_per_sm(const struct shim_device *d, const struct kernel_limits *k, int block, size_t smem) {
	int warp = attr(d, DA_WARP_SIZE) > 0 ? attr(d, DA_WARP_SIZE) : 32;
	if (block <= 0 || block > k->max_threads || block > attr(d, DA_MAX_THREADS_PER_BLOCK)) return 0;
	if ((long)k->static_shared + (long)smem > attr(d, DA_MAX_SHARED_PER_BLOCK_OPTIN)) return 0;
	int warps = (block + warp - 1) / warp;
	int n = attr(d, DA_MAX_BLOCKS_PER_SM);
	int by_threads = attr(d, DA_MAX_THREADS_PER_SM) / warp / warps;
	if (by_threads < n) n = by_threads;
	if (k->regs > 0) {
		if ((long)k->regs * block > attr(d, DA_MAX_REGISTERS_PER_BLOCK)) return 0;
		long per_warp = round_up((long)k->regs * warp, REG_ALLOC_UNIT);
		long per_partition = attr(d, DA_MAX_REGISTERS_PER_SM) / SM_PARTITIONS;
		long warps_by_regs = per_partition / per_warp * SM_PARTITIONS;
		int by_regs = (int)(warps_by_regs / warps);
		if (by_regs < n) n = by_regs;
	}
	long shared = (long)k->static_shared + (long)smem;
	if (shared > 0) {
		shared = round_up(shared + attr(d, DA_RESERVED_SHARED_PER_BLOCK), SHARED_ALLOC_UNIT);
		int by_shared = (int)(attr(d, DA_MAX_SHARED_PER_SM) / shared);
		if (by_shared < n) n = by_shared;
	}
	return n > 0 ? n : 0;
}

static int device_of(const struct shim_device **d) {
	int r = shim_connect();
	if (r != 0) return r;
	*d = shim_device();
	return *d != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

SHIM_EXPORT int cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, void *func, int blockSize,
								    size_t dynamicSMemSize, unsigned int flags) {
	SHIM_LOCAL();
	const struct shim_device *d;
	struct kernel_limits k;
	int r;
	if (numBlocks == NULL || flags > 1) return CUDA_ERROR_INVALID_VALUE;
	if ((r = device_of(&d)) != 0 || (r = limits(func, &k)) != 0) return r;
	*numBlocks = blocks_per_sm(d, &k, blockSize, dynamicSMemSize);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, void *func, int blockSize,
							     size_t dynamicSMemSize) {
	return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize, dynamicSMemSize, 0);
}

/* The block size that keeps the most warps busy (the largest of equals), and the grid that fills the GPU with it. */
SHIM_EXPORT int cuOccupancyMaxPotentialBlockSizeWithFlags(int *minGridSize, int *blockSize, void *func,
							  size_t (*smemOf)(int), size_t dynamicSMemSize,
							  int blockSizeLimit, unsigned int flags) {
	SHIM_LOCAL();
	const struct shim_device *d;
	struct kernel_limits k;
	int r;
	if (minGridSize == NULL || blockSize == NULL || flags > 1) return CUDA_ERROR_INVALID_VALUE;
	if ((r = device_of(&d)) != 0 || (r = limits(func, &k)) != 0) return r;
	int warp = attr(d, DA_WARP_SIZE) > 0 ? attr(d, DA_WARP_SIZE) : 32;
	int limit = k.max_threads < attr(d, DA_MAX_THREADS_PER_BLOCK) ? k.max_threads : attr(d, DA_MAX_THREADS_PER_BLOCK);
	if (blockSizeLimit > 0 && blockSizeLimit < limit) limit = blockSizeLimit;
	int best_block = 0, best_blocks = 0;
	long best_threads = 0;
	for (int b = round_up(limit, warp); b > 0; b -= warp) {
		int size = b > limit ? limit : b;
		size_t smem = smemOf != NULL ? smemOf(size) : dynamicSMemSize;
		int n = blocks_per_sm(d, &k, size, smem);
		if ((long)n * size > best_threads) {
			best_threads = (long)n * size;
			best_block = size;
			best_blocks = n;
		}
	}
	*blockSize = best_block;
	*minGridSize = best_blocks * attr(d, DA_MULTIPROCESSOR_COUNT);
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, void *func, size_t (*smemOf)(int),
						 size_t dynamicSMemSize, int blockSizeLimit) {
	return cuOccupancyMaxPotentialBlockSizeWithFlags(minGridSize, blockSize, func, smemOf, dynamicSMemSize,
							 blockSizeLimit, 0);
}

/* The most dynamic shared memory per block with which numBlocks blocks of blockSize threads fit on one SM. */
SHIM_EXPORT int cuOccupancyAvailableDynamicSMemPerBlock(size_t *dynamicSmemSize, void *func, int numBlocks,
							int blockSize) {
	SHIM_LOCAL();
	const struct shim_device *d;
	struct kernel_limits k;
	int r;
	if (dynamicSmemSize == NULL || numBlocks <= 0) return CUDA_ERROR_INVALID_VALUE;
	if ((r = device_of(&d)) != 0 || (r = limits(func, &k)) != 0) return r;
	*dynamicSmemSize = 0;
	if (blocks_per_sm(d, &k, blockSize, 0) < numBlocks) return CUDA_SUCCESS;
	long per_block = attr(d, DA_MAX_SHARED_PER_SM) / numBlocks / SHARED_ALLOC_UNIT * SHARED_ALLOC_UNIT;
	long avail = per_block - attr(d, DA_RESERVED_SHARED_PER_BLOCK) - k.static_shared;
	long optin = attr(d, DA_MAX_SHARED_PER_BLOCK_OPTIN) - k.static_shared;
	if (avail > optin) avail = optin;
	*dynamicSmemSize = avail > 0 ? (size_t)avail : 0;
	return CUDA_SUCCESS;
}

/* cluster_size is the blocks per cluster a launch configuration asks for (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION),
 * 1 without clusters. */
static long cluster_size(const struct shim_launch_config *c) {
	for (unsigned i = 0; c->attrs != NULL && i < c->num_attrs; i++) {
		const uint8_t *a = c->attrs + SHIM_LAUNCH_ATTR_SIZE * (size_t)i;
		uint32_t id, x, y, z;
		memcpy(&id, a, 4);
		if (id != 4) continue;
		memcpy(&x, a + 8, 4);
		memcpy(&y, a + 12, 4);
		memcpy(&z, a + 16, 4);
		return (long)x * y * z;
	}
	return 1;
}

SHIM_EXPORT int cuOccupancyMaxActiveClusters(int *numClusters, void *func, const struct shim_launch_config *config) {
	SHIM_LOCAL();
	const struct shim_device *d;
	struct kernel_limits k;
	int r;
	if (numClusters == NULL || config == NULL) return CUDA_ERROR_INVALID_VALUE;
	if ((r = device_of(&d)) != 0 || (r = limits(func, &k)) != 0) return r;
	if (!attr(d, DA_CLUSTER_LAUNCH)) return CUDA_ERROR_NOT_SUPPORTED;
	long cs = cluster_size(config);
	if (shim_debug() > 1)
		shim_log("cuOccupancyMaxActiveClusters: grid %ux%ux%u block %ux%ux%u shmem %u, %u attributes, cluster %ld",
			 config->grid[0], config->grid[1], config->grid[2], config->block[0], config->block[1],
			 config->block[2], config->shmem, config->num_attrs, cs);
	if (cs <= 0) return CUDA_ERROR_INVALID_VALUE;
	if (cs > 16) { /* no cluster that large can be resident (cuBLAS probes sizes until the answer is 0) */
		*numClusters = 0;
		return CUDA_SUCCESS;
	}
	int block = (int)(config->block[0] * (config->block[1] ? config->block[1] : 1) *
			  (config->block[2] ? config->block[2] : 1));
	long blocks = (long)blocks_per_sm(d, &k, block, config->shmem) * attr(d, DA_MULTIPROCESSOR_COUNT);
	*numClusters = (int)(blocks / cs);
	return CUDA_SUCCESS;
}

/* 8 blocks is the portable cluster size; 16 where the kernel allows non-portable sizes. */
SHIM_EXPORT int cuOccupancyMaxPotentialClusterSize(int *clusterSize, void *func,
						  const struct shim_launch_config *config) {
	SHIM_LOCAL();
	const struct shim_device *d;
	int r, nonportable = 0;
	if (clusterSize == NULL || config == NULL) return CUDA_ERROR_INVALID_VALUE;
	if ((r = device_of(&d)) != 0) return r;
	if (!attr(d, DA_CLUSTER_LAUNCH)) return CUDA_ERROR_NOT_SUPPORTED;
	if ((r = shim_func_attr(func, FA_NON_PORTABLE_CLUSTER, &nonportable)) != 0) return r;
	*clusterSize = nonportable ? 16 : 8;
	return CUDA_SUCCESS;
}
