/*
 * graph.c: CUDA graphs through the gpuserver. While a stream captures, the gpuserver records the asynchronous work
 * the function issues on it (launches, memsets, device-to-device copies) into a graph instead of running it; a
 * graph is instantiated there, and cuGraphLaunch (generated: one fire-and-forget record) replays the recorded work
 * in order on the function's stream. Here: the entry points whose semantics need the shim's own state (the
 * stream's capture state, answered locally by stream.c; each graph's node count for cuGraphGetNodes; each
 * executable graph's flags) and the older or wider variants that map onto the remoted calls.
 *
 * Nodes have no handles of their own: cuGraphGetNodes answers placeholders that identify the graph and the
 * node's index, enough for callers that count nodes (PyTorch warns about an empty graph). Calls that edit a graph
 * node by node are not supported.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

int cuGraphUpload(void *exec, void *stream);

enum { CAPTURE_MODE_GLOBAL = 0, CAPTURE_MODE_RELAXED = 2 };
enum { INSTANTIATE_FLAG_UPLOAD = 2 };
enum { INSTANTIATE_SUCCESS = 0, INSTANTIATE_ERROR = 1 };

/* What the shim knows of a graph (its node count) or an executable graph (its flags), by handle. */
struct graph_info {
	void *handle;
	uint64_t value;
	struct graph_info *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct graph_info *graphs, *execs;

static void remember(struct graph_info **list, void *h, uint64_t v) {
	struct graph_info *g = calloc(1, sizeof *g);
	if (g == NULL) return; /* a count or flags of 0 is answered for it */
	g->handle = h;
	g->value = v;
	pthread_mutex_lock(&mu);
	g->next = *list;
	*list = g;
	pthread_mutex_unlock(&mu);
}

static int lookup(struct graph_info **list, void *h, uint64_t *v) {
	int found = 0;
	pthread_mutex_lock(&mu);
	for (struct graph_info *g = *list; g != NULL; g = g->next)
		if (g->handle == h) {
			*v = g->value;
			found = 1;
			break;
		}
	pthread_mutex_unlock(&mu);
	return found;
}

static void forget(struct graph_info **list, void *h) {
	pthread_mutex_lock(&mu);
	for (struct graph_info **p = list; *p != NULL; p = &(*p)->next)
		if ((*p)->handle == h) {
			struct graph_info *g = *p;
			*p = g->next;
			free(g);
			break;
		}
	pthread_mutex_unlock(&mu);
}

/* ---- capture */

SHIM_EXPORT int cuStreamBeginCapture_v2(void *h, int mode) {
	if (mode < CAPTURE_MODE_GLOBAL || mode > CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
	/* The legacy default stream synchronises with every other stream: it cannot capture. */
	if (h == NULL || h == (void *)0x1) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	int status;
	uint64_t id;
	int r = shim_stream_capture_status(h, &status, &id);
	if (r != 0) return r;
	if (status != SHIM_CAPTURE_NONE) return CUDA_ERROR_ILLEGAL_STATE;
	r = rpc_streamBeginCapture(h, (unsigned)mode);
	if (r != 0) return r;
	return shim_stream_capture_begin(h, mode);
}

SHIM_EXPORT int cuStreamBeginCapture(void *h) { return cuStreamBeginCapture_v2(h, CAPTURE_MODE_GLOBAL); }

SHIM_EXPORT int cuStreamEndCapture(void *h, void **phGraph) {
	if (phGraph == NULL) return shim_null_arg("cuStreamEndCapture", "phGraph");
	int status;
	uint64_t id;
	int r = shim_stream_capture_status(h, &status, &id);
	if (r != 0) return r;
	if (status == SHIM_CAPTURE_NONE) return CUDA_ERROR_ILLEGAL_STATE;
	unsigned long long nodes = 0;
	*phGraph = NULL;
	r = rpc_streamEndCapture(phGraph, &nodes, h);
	shim_stream_capture_end(h); /* the capture is over whatever the gpuserver answered */
	if (r == 0) remember(&graphs, *phGraph, nodes);
	else *phGraph = NULL;
	return r;
}

SHIM_EXPORT int cuStreamUpdateCaptureDependencies_v2(void *h, void *deps, const void *edges, size_t n,
						     unsigned int flags) {
	SHIM_LOCAL();
	(void)deps, (void)edges, (void)n;
	if (flags > 1) return CUDA_ERROR_INVALID_VALUE; /* CU_STREAM_ADD_CAPTURE_DEPENDENCIES or _SET_ */
	int status;
	uint64_t id;
	int r = shim_stream_capture_status(h, &status, &id);
	if (r != 0) return r;
	/* The recorded work runs in order: every node depends on all before it, whatever the caller names. */
	return status == SHIM_CAPTURE_ACTIVE ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_STATE;
}

SHIM_EXPORT int cuStreamUpdateCaptureDependencies(void *h, void *deps, size_t n, unsigned int flags) {
	return cuStreamUpdateCaptureDependencies_v2(h, deps, NULL, n, flags);
}

/* ---- graphs */

SHIM_EXPORT int cuGraphGetNodes(void *graph, void **nodes, size_t *numNodes) {
	SHIM_LOCAL();
	if (numNodes == NULL) return CUDA_ERROR_INVALID_VALUE;
	uint64_t count;
	if (!lookup(&graphs, graph, &count)) return CUDA_ERROR_INVALID_VALUE;
	if (nodes == NULL) {
		*numNodes = count;
		return CUDA_SUCCESS;
	}
	size_t n = *numNodes < count ? *numNodes : count;
	for (size_t i = 0; i < *numNodes; i++)
		nodes[i] = i < n ? (void *)((uintptr_t)graph + 16 * (i + 1)) : NULL;
	*numNodes = n;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuGraphDestroy(void *graph) {
	int r = rpc_cuGraphDestroy(graph);
	if (r == 0) forget(&graphs, graph);
	return r;
}

SHIM_EXPORT int cuGraphInstantiateWithFlags(void **phGraphExec, void *graph, unsigned long long flags) {
	if (phGraphExec == NULL) return shim_null_arg("cuGraphInstantiateWithFlags", "phGraphExec");
	int r = rpc_cuGraphInstantiateWithFlags(phGraphExec, graph, flags);
	if (r == 0) remember(&execs, *phGraphExec, flags);
	return r;
}

static void instantiate_log(char *buf, size_t size, int r) {
	if (buf == NULL || size == 0) return;
	const char *msg = r == 0 ? "" : "faas-gpu shim: the gpuserver refused to instantiate the graph";
	strncpy(buf, msg, size - 1);
	buf[size - 1] = 0;
}

SHIM_EXPORT int cuGraphInstantiate_v2(void **phGraphExec, void *graph, void **errNode, char *logBuffer,
				      size_t bufferSize) {
	SHIM_LOCAL();
	int r = cuGraphInstantiateWithFlags(phGraphExec, graph, 0);
	if (errNode != NULL) *errNode = NULL;
	instantiate_log(logBuffer, bufferSize, r);
	return r;
}

SHIM_EXPORT int cuGraphInstantiate(void **phGraphExec, void *graph, void **errNode, char *logBuffer,
				   size_t bufferSize) {
	return cuGraphInstantiate_v2(phGraphExec, graph, errNode, logBuffer, bufferSize);
}

/* CUDA_GRAPH_INSTANTIATE_PARAMS: u64 flags, CUstream hUploadStream, CUgraphNode hErrNode_out, int result_out. */
struct instantiate_params {
	uint64_t flags;
	void *upload_stream;
	void *err_node;
	int result;
};

SHIM_EXPORT int cuGraphInstantiateWithParams(void **phGraphExec, void *graph, struct instantiate_params *p) {
	SHIM_LOCAL();
	if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
	int r = cuGraphInstantiateWithFlags(phGraphExec, graph, p->flags & ~(uint64_t)INSTANTIATE_FLAG_UPLOAD);
	if (r == 0 && (p->flags & INSTANTIATE_FLAG_UPLOAD)) r = cuGraphUpload(*phGraphExec, p->upload_stream);
	p->err_node = NULL;
	p->result = r == 0 ? INSTANTIATE_SUCCESS : INSTANTIATE_ERROR;
	return r;
}

SHIM_EXPORT int cuGraphExecGetFlags(void *exec, unsigned long long *flags) {
	SHIM_LOCAL();
	if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
	uint64_t f;
	if (!lookup(&execs, exec, &f)) return CUDA_ERROR_INVALID_VALUE;
	*flags = f;
	return CUDA_SUCCESS;
}

SHIM_EXPORT int cuGraphExecDestroy(void *exec) {
	int r = rpc_cuGraphExecDestroy(exec);
	if (r == 0) forget(&execs, exec);
	return r;
}

/* CUgraphExecUpdateResultInfo: int result, CUgraphNode errorNode, CUgraphNode errorFromNode. */
struct update_info {
	int result;
	void *error_node;
	void *error_from_node;
};

SHIM_EXPORT int cuGraphExecUpdate_v2(void *exec, void *graph, struct update_info *info) {
	SHIM_LOCAL();
	unsigned result = 0;
	int r = rpc_graphExecUpdate(&result, exec, graph);
	if (info != NULL) {
		info->result = (int)result;
		info->error_node = NULL;
		info->error_from_node = NULL;
	}
	if (r == 0 && result != 0) r = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
	return r;
}

SHIM_EXPORT int cuGraphExecUpdate(void *exec, void *graph, void **errNode, int *updateResult) {
	struct update_info info = {0};
	int r = cuGraphExecUpdate_v2(exec, graph, &info);
	if (errNode != NULL) *errNode = NULL;
	if (updateResult != NULL) *updateResult = info.result;
	return r;
}
