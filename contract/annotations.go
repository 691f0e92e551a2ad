package contract

// Annotations of a function's deployment. faas-cli drops `limits: nvidia.com/gpu`, so GPU requirements travel as
// annotations; the presence of AnnotationMemory makes a function a GPU function. A bad value is refused at deploy
// with 400 and a message naming the annotation.
const (
	// AnnotationPrefix prefixes every GPU annotation; an annotation under it that is not one of the GPU annotations
	// is refused (a typo must not drop a requirement silently).
	AnnotationPrefix = "com.openfaas.gpu."
	// AnnotationMemory is the function's GPU memory quota as a Kubernetes quantity (1536Mi, 2Gi, 500M).
	AnnotationMemory = "com.openfaas.gpu.memory"
	// AnnotationSLO is the latency deadline of one request as a Go duration (80ms).
	AnnotationSLO = "com.openfaas.gpu.slo"
	// AnnotationPercentile is the percentile of requests that must meet the SLO, in (0, 100); DefaultPercentile
	// when absent.
	AnnotationPercentile = "com.openfaas.gpu.slo.percentile"
	// AnnotationIsolation is IsolationShared (the default) or IsolationIsolated.
	AnnotationIsolation = "com.openfaas.gpu.isolation"
	// AnnotationScratch is ScratchResident (the default: GPU memory allocated after initialisation stays with the
	// function while it is resident) or ScratchRequest (it is the request's, a KV cache: given back when the
	// function's last request ends, mapped again zeroed for the next).
	AnnotationScratch = "com.openfaas.gpu.scratch"
	// AnnotationModel is ModelPrivate (the default) or ModelShared: the function never writes its model memory
	// after its initialisation, so chunks identical to another such function's of its namespace are shared on a
	// GPU.
	AnnotationModel = "com.openfaas.gpu.model"

	// AnnotationQueue names the queue of a function's asynchronous calls (stream OF_<queue>; see ValidateQueueName).
	AnnotationQueue = "com.openfaas.queue"
)

// GPUAnnotation reports whether name is one of the GPU annotations.
func GPUAnnotation(name string) bool {
	switch name {
	case AnnotationMemory, AnnotationSLO, AnnotationPercentile, AnnotationIsolation, AnnotationScratch,
		AnnotationModel, AnnotationComputeRequest, AnnotationComputeLimit:
		return true
	}
	return false
}

// Values of the GPU annotations.
const (
	// IsolationShared: the function shares GPUs with the other functions of its namespace (its tenant).
	IsolationShared = "shared"
	// IsolationIsolated: the function is a tenant of its own (an executor process of its own, a GPU of its own
	// while bound).
	IsolationIsolated = "isolated"

	ScratchResident = "resident"
	ScratchRequest  = "request"

	ModelPrivate = "private"
	ModelShared  = "shared"
)

// DefaultPercentile is the SLO percentile of a function that names none (AnnotationPercentile).
const DefaultPercentile = 98.0
