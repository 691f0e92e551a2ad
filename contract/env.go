package contract

// Environment of a GPU function's process, set by the provider (local processes, Kubernetes pods). The gpu-python
// template reads the function's settings and the gpuserver's API socket; the shim reads the function's name and
// token and the remoting socket.
const (
	// EnvGPU is "1" for a GPU function: the template wraps each request in acquire and release.
	EnvGPU = "FAAS_GPU"
	// EnvFunction is the function's name on the gpuserver (name, or name.namespace outside the default one).
	EnvFunction = "FAAS_GPU_FUNCTION"
	// EnvInstance names the process's instance of the function (its replica): the template's acquires and the
	// shim's hello carry it, and each instance has GPU memory of its own, bound on a GPU of its own one request at a
	// time, so a function serves as many requests at once as it has instances. The template sets it from HOSTNAME
	// (the provider's replica id, a pod's name) when it is not set; "" is the function itself.
	EnvInstance = "FAAS_GPU_INSTANCE"
	// EnvToken is the function's credential for acquire, release and the remoting hello.
	EnvToken = "FAAS_GPU_TOKEN"
	// EnvSocket is the gpuserver's API socket (acquire, release, register).
	EnvSocket = "FAAS_GPU_SOCKET"
	// EnvRemotingSocket is the gpuserver's remoting socket, which the shim connects to.
	EnvRemotingSocket = "FAAS_GPU_REMOTING_SOCKET"
	// EnvMemoryBytes, EnvSLO, EnvPercentile, EnvIsolation, EnvScratch and EnvModel carry the function's GPU spec
	// (its annotations, parsed), so that a function that registers itself (EnvSelfRegister) registers what was
	// deployed.
	EnvMemoryBytes = "FAAS_GPU_MEMORY_BYTES"
	EnvSLO         = "FAAS_GPU_SLO"
	EnvPercentile  = "FAAS_GPU_SLO_PERCENTILE"
	EnvIsolation   = "FAAS_GPU_ISOLATION"
	EnvScratch     = "FAAS_GPU_SCRATCH"
	EnvModel       = "FAAS_GPU_MODEL"
	// EnvSelfRegister asks the template to register with its node's gpuserver at start (in a cluster the provider
	// cannot reach the gpuserver of the node a pod lands on); the answer carries the remoting token.
	EnvSelfRegister = "FAAS_GPU_SELF_REGISTER"
	// EnvRegistrationTicket is the credential that registers exactly the function's spec.
	EnvRegistrationTicket = "FAAS_GPU_REGISTRATION_TICKET"
)

// Settings a function's deployment may give its process (its environment in stack.yml).
const (
	// EnvAcquireTimeoutMS bounds the template's wait for a GPU, in milliseconds.
	EnvAcquireTimeoutMS = "FAAS_GPU_ACQUIRE_TIMEOUT_MS"
	// EnvMaxBodyBytes bounds a request body the template accepts.
	EnvMaxBodyBytes = "FAAS_GPU_MAX_BODY_BYTES"
	// EnvListenBacklog is the template's listen backlog.
	EnvListenBacklog = "FAAS_GPU_LISTEN_BACKLOG"
	// EnvStreamBufferBytes bounds the bytes of a streamed response that wait for a slow client in the template
	// once generated (the GPU binding is released when the generation ends); beyond it the stream ends.
	EnvStreamBufferBytes = "FAAS_GPU_STREAM_BUFFER_BYTES"
	// EnvConcurrency is how many requests the template runs at once in one process under one GPU binding (default:
	// the handler module's CONCURRENCY, else 1: a binding per request). The llm function's continuous batching sets it.
	EnvConcurrency = "FAAS_GPU_CONCURRENCY"
	// EnvRemotingRingMB is the size of the shim's ring, in MiB.
	EnvRemotingRingMB = "FAAS_GPU_REMOTING_RING_MB"
	// EnvRemotingSpinUS is how long the shim spins for an answer before it sleeps, in microseconds.
	EnvRemotingSpinUS = "FAAS_GPU_REMOTING_SPIN_US"
	// EnvRemotingSync makes every call of the shim synchronous (a debugging aid).
	EnvRemotingSync = "FAAS_GPU_REMOTING_SYNC"
	// EnvRemotingLocalSync (on by default) lets the shim answer a synchronisation itself when nothing it sent is
	// outstanding.
	EnvRemotingLocalSync = "FAAS_GPU_REMOTING_LOCAL_SYNC"
	// EnvShimDebug makes the shim log what it does.
	EnvShimDebug = "FAAS_GPU_SHIM_DEBUG"
)

// Environment lists every variable of the function contract: those the provider sets, then those a deployment
// may set.
func Environment() []string {
	return []string{EnvGPU, EnvFunction, EnvInstance, EnvToken, EnvSocket, EnvRemotingSocket, EnvMemoryBytes, EnvSLO,
		EnvPercentile, EnvIsolation, EnvScratch, EnvModel, EnvSelfRegister, EnvRegistrationTicket,
		EnvAcquireTimeoutMS, EnvMaxBodyBytes, EnvListenBacklog, EnvStreamBufferBytes, EnvConcurrency, EnvRemotingRingMB,
		EnvRemotingSpinUS, EnvRemotingSync, EnvRemotingLocalSync, EnvShimDebug}
}
