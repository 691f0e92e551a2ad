// Package gpuspec reads a function's GPU requirements from its OpenFaaS annotations (package contract names them):
// faas-cli drops `limits: nvidia.com/gpu`, so GPU requirements travel as annotations; the presence of
// com.openfaas.gpu.memory makes a function a GPU function.
package gpuspec

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
	"github.com/faas-gpu/faas-gpu/provider"
)

// ValidateQueue checks a deployment's com.openfaas.queue annotation, when present: a valid queue name (1 to 64
// letters, digits, '-' and '_': a NATS stream name once prefixed) that is not reserved (the dead letters'
// faas-dead-letter, or anything starting with it, would make the queue worker consume its own dead letters).
// Errors wrap provider.ErrInvalid and name the annotation. Deploys and updates check it; functions already
// deployed are not refused (the queue worker ignores a bad queue and uses the default one).
func ValidateQueue(annotations map[string]string) error {
	v, ok := annotations[contract.AnnotationQueue]
	if !ok {
		return nil
	}
	if err := contract.ValidateQueueName(strings.TrimSpace(v)); err != nil {
		return fmt.Errorf("%w: annotation %s: %v", provider.ErrInvalid, contract.AnnotationQueue, err)
	}
	return nil
}

// Parse reads the GPU annotations of function. isGPU is false (and spec empty) when the function has no GPU
// annotation at all. Errors wrap provider.ErrInvalid and name the annotation and the problem; an annotation under
// Prefix that is not one of the four known ones is refused so that a typo does not silently drop a requirement.
func Parse(annotations map[string]string, function string) (spec pool.FunctionSpec, isGPU bool, err error) {
	var unknown []string
	sawGPU := false
	for k := range annotations {
		if !strings.HasPrefix(k, contract.AnnotationPrefix) {
			continue
		}
		sawGPU = true
		if !contract.GPUAnnotation(k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s is not a GPU annotation (known: %s, %s, %s, %s)",
			provider.ErrInvalid, unknown[0], contract.AnnotationMemory, contract.AnnotationSLO, contract.AnnotationPercentile, contract.AnnotationIsolation+
				", "+contract.AnnotationScratch+", "+contract.AnnotationModel+", "+contract.AnnotationComputeRequest+", "+
				contract.AnnotationComputeLimit)
	}
	if !sawGPU {
		return pool.FunctionSpec{}, false, nil
	}
	memory, ok := annotations[contract.AnnotationMemory]
	if !ok {
		return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s is required when any %s* annotation is set",
			provider.ErrInvalid, contract.AnnotationMemory, contract.AnnotationPrefix)
	}
	spec.Name = function
	if spec.MemoryBytes, err = ParseQuantity(memory); err != nil {
		return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %v", provider.ErrInvalid, contract.AnnotationMemory, err)
	}
	if v, ok := annotations[contract.AnnotationSLO]; ok {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		switch {
		case err != nil:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q is not a duration (e.g. 80ms, 1.5s)",
				provider.ErrInvalid, contract.AnnotationSLO, v)
		case d < 0:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q is negative",
				provider.ErrInvalid, contract.AnnotationSLO, v)
		}
		spec.SLO = d
	}
	spec.Percentile = contract.DefaultPercentile
	if v, ok := annotations[contract.AnnotationPercentile]; ok {
		p, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		switch {
		case err != nil:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q is not a number",
				provider.ErrInvalid, contract.AnnotationPercentile, v)
		case math.IsNaN(p) || p <= 0 || p >= 100:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q must be in (0, 100)",
				provider.ErrInvalid, contract.AnnotationPercentile, v)
		}
		spec.Percentile = p
	}
	spec.Isolation = contract.IsolationShared
	if v, ok := annotations[contract.AnnotationIsolation]; ok {
		switch iso := strings.TrimSpace(v); iso {
		case contract.IsolationShared, contract.IsolationIsolated:
			spec.Isolation = iso
		default:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q must be %q or %q",
				provider.ErrInvalid, contract.AnnotationIsolation, v, contract.IsolationShared, contract.IsolationIsolated)
		}
	}
	if v, ok := annotations[contract.AnnotationScratch]; ok {
		switch sc := strings.TrimSpace(v); sc {
		case contract.ScratchResident, contract.ScratchRequest:
			spec.Scratch = sc
		default:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q must be %q or %q",
				provider.ErrInvalid, contract.AnnotationScratch, v, contract.ScratchResident, contract.ScratchRequest)
		}
	}
	if v, ok := annotations[contract.AnnotationModel]; ok {
		switch m := strings.TrimSpace(v); m {
		case contract.ModelPrivate, contract.ModelShared:
			spec.Model = m
		default:
			return pool.FunctionSpec{}, false, fmt.Errorf("%w: annotation %s: %q must be %q or %q",
				provider.ErrInvalid, contract.AnnotationModel, v, contract.ModelPrivate, contract.ModelShared)
		}
	}
	if spec.ComputeRequest, spec.ComputeLimit, err = parseShares(annotations); err != nil {
		return pool.FunctionSpec{}, false, err
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
