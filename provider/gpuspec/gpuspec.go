// Package gpuspec reads a function's GPU requirements from its OpenFaaS annotations. faas-cli drops
// `limits: nvidia.com/gpu`, so GPU requirements travel as annotations; the presence of com.openfaas.gpu.memory makes
// a function a GPU function.
package gpuspec

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// AnnotationQueue names a function's queue for asynchronous calls (stream OF_<queue>).
const AnnotationQueue = queue.AnnotationQueue

// ValidateQueue checks a deployment's com.openfaas.queue annotation, when present: a valid queue name (1 to 64
// letters, digits, '-' and '_': a NATS stream name once prefixed) that is not reserved (the dead letters'
// faas-dead-letter, or anything starting with it, would make the queue worker consume its own dead letters).
// Errors wrap provider.ErrInvalid and name the annotation. Deploys and updates check it; functions already
// deployed are not refused (the queue worker ignores a bad queue and uses the default one).
func ValidateQueue(annotations map[string]string) error {
	v, ok := annotations[AnnotationQueue]
	if !ok {
		return nil
	}
	if err := queue.ValidateName(strings.TrimSpace(v)); err != nil {
		return fmt.Errorf("%w: annotation %s: %v", provider.ErrInvalid, AnnotationQueue, err)
	}
	return nil
}

// Annotation names. Every annotation under Prefix must be one of these.
const (
	// Prefix of every GPU annotation.
	Prefix = "com.openfaas.gpu."
	// AnnotationMemory is the function's GPU memory quota as a Kubernetes quantity (1536Mi, 2Gi, 500M).
	AnnotationMemory = "com.openfaas.gpu.memory"
	// AnnotationSLO is the latency deadline of one request as a Go duration (80ms).
	AnnotationSLO = "com.openfaas.gpu.slo"
	// AnnotationPercentile is the percentile of requests that must meet the SLO, in (0, 100); default 98.
	AnnotationPercentile = "com.openfaas.gpu.slo.percentile"
	// AnnotationIsolation is "shared" (default) or "isolated" (a GPU of its own while bound).
	AnnotationIsolation = "com.openfaas.gpu.isolation"
	// AnnotationScratch is "resident" (default: GPU memory allocated after initialisation stays with the function
	// while it is resident) or "request" (it is the request's, a KV cache: given back when the function's last
	// request ends, mapped again zeroed for the next).
	AnnotationScratch = "com.openfaas.gpu.scratch"
	// AnnotationModel is "private" (default) or "shared": the function never writes its model memory after its
	// initialisation, so chunks identical to another such function's of its namespace are shared on a GPU.
	AnnotationModel = "com.openfaas.gpu.model"
)

var known = map[string]bool{
	AnnotationMemory: true, AnnotationSLO: true, AnnotationPercentile: true, AnnotationIsolation: true,
	AnnotationScratch: true, AnnotationModel: true,
}

// Parse reads the GPU annotations of function. isGPU is false (and spec empty) when the function has no GPU
// annotation at all. Errors wrap provider.ErrInvalid and name the annotation and the problem; an annotation under
// Prefix that is not one of the four known ones is refused so that a typo does not silently drop a requirement.
func Parse(annotations map[string]string, function string) (spec pool.FunctionSpec, isGPU bool, err error) {
	var unknown []string
	sawGPU := false
	for k := range annotations {
		if !strings.HasPrefix(k, Prefix) {
			continue
		}
		sawGPU = true
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s is not a GPU annotation (known: %s, %s, %s, %s)",
			provider.ErrInvalid, unknown[0], AnnotationMemory, AnnotationSLO, AnnotationPercentile, AnnotationIsolation+
				", "+AnnotationScratch+", "+AnnotationModel)
	}
	if !sawGPU {
		return pool.FunctionSpec{}, false, nil
	}
	memory, ok := annotations[AnnotationMemory]
	if !ok {
		return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s is required when any %s* annotation is set",
			provider.ErrInvalid, AnnotationMemory, Prefix)
	}
	spec.Name = function
	if spec.MemoryBytes, err = ParseQuantity(memory); err != nil {
		return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %v", provider.ErrInvalid, AnnotationMemory, err)
	}
	if v, ok := annotations[AnnotationSLO]; ok {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		switch {
		case err != nil:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q is not a duration (e.g. 80ms, 1.5s)",
				provider.ErrInvalid, AnnotationSLO, v)
		case d < 0:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q is negative",
				provider.ErrInvalid, AnnotationSLO, v)
		}
		spec.SLO = d
	}
	spec.Percentile = pool.DefaultPercentile
	if v, ok := annotations[AnnotationPercentile]; ok {
		p, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		switch {
		case err != nil:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q is not a number",
				provider.ErrInvalid, AnnotationPercentile, v)
		case math.IsNaN(p) || p <= 0 || p >= 100:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q must be in (0, 100)",
				provider.ErrInvalid, AnnotationPercentile, v)
		}
		spec.Percentile = p
	}
	spec.Isolation = pool.IsolationShared
	if v, ok := annotations[AnnotationIsolation]; ok {
		switch iso := strings.TrimSpace(v); iso {
		case pool.IsolationShared, pool.IsolationIsolated:
			spec.Isolation = iso
		default:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q must be %q or %q",
				provider.ErrInvalid, AnnotationIsolation, v, pool.IsolationShared, pool.IsolationIsolated)
		}
	}
	if v, ok := annotations[AnnotationScratch]; ok {
		switch sc := strings.TrimSpace(v); sc {
		case pool.ScratchResident, pool.ScratchRequest:
			spec.Scratch = sc
		default:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q must be %q or %q",
				provider.ErrInvalid, AnnotationScratch, v, pool.ScratchResident, pool.ScratchRequest)
		}
	}
	if v, ok := annotations[AnnotationModel]; ok {
		switch m := strings.TrimSpace(v); m {
		case pool.ModelPrivate, pool.ModelShared:
			spec.Model = m
		default:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q must be %q or %q",
				provider.ErrInvalid, AnnotationModel, v, pool.ModelPrivate, pool.ModelShared)
		}
	}
	if err := spec.Validate(); err != nil {
		return pool.FunctionSpec{}, false, fmt.Errorf("%w: GPU annotations of %q: %v", provider.ErrInvalid, function, err)
	}
	return spec, true, nil
}

// FunctionName is the name a function has on the gpuserver (FunctionSpec.Name, and FAAS_GPU_FUNCTION of its
// replicas): its service name in the default namespace, and <service>.<namespace> elsewhere, so that functions of
// different namespaces sharing a node's gpuserver never collide. Every backend and the handlers use it.
func FunctionName(service, namespace string) string {
	if namespace == "" || namespace == provider.DefaultNamespace {
		return service
	}
	return service + "." + namespace
}
