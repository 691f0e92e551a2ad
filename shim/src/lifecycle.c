/*
 * lifecycle.c: the process tells the gpuserver where it is in its own life. A function's replicas share its
 * memory on the node; a replica that starts after the function's first request initialises while the other
 * replicas serve requests, so the server cannot tell its initialisation from a request by the bindings alone.
 * The gpu-python template calls faas_gpu_initialising() before it imports the handler and faas_gpu_initialised()
 * after: the blocks allocated between the two are the initialisation's (kept, never given back as a request's
 * scratch), and the function's image is not captured while a replica is between the two. Not CUDA entry points;
 * each returns a CUresult (CUDA_ERROR_NOT_SUPPORTED from a server before wire minor 3).
 */
#include "shim.h"

SHIM_EXPORT int faas_gpu_initialising(void) { return rpc_processPhase(1); }

SHIM_EXPORT int faas_gpu_initialised(void) { return rpc_processPhase(2); }
