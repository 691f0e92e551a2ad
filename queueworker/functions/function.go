// Package functions tells the queue worker and the front door what they need to know of a deployed function: its
// queue, its latency SLO and whether it runs on the GPU pool. Functions are named as /function/{name} takes them:
// "name" (the default namespace) or "name.namespace" (what faas-cli sends). A Cache reads a Catalog (the
// provider's backend in-process, or the gateway's GET /system/functions and /system/namespaces over HTTP) and
// caches each namespace's listing; tests inject their own Source.
package functions

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/queueworker/queue"
)

// ErrUnknownFunction is returned (wrapped) for a function the provider does not know.
var ErrUnknownFunction = errors.New("unknown function")

// Function is what the queue path needs to know about one deployed function.
type Function struct {
	// Name is the function's canonical reference: its name in the default namespace, "name.namespace" in any
	// other (the gpuserver's convention), so that "echo" and "echo.openfaas-fn" are one function.
	Name string
	// Queue is the function's queue (com.openfaas.queue), queue.DefaultQueue when not annotated.
	Queue string
	// SLO is the latency deadline of one request from the time it entered the system; 0 means none.
	SLO time.Duration
	// Percentile of requests that should meet the SLO.
	Percentile float64
	// GPU is true for a function that runs on the node's GPU pool (it has a com.openfaas.gpu.memory annotation);
	// its dispatch is admitted by the pool's capacity.
	GPU bool
}

// Source looks functions up by reference ("name" or "name.namespace").
type Source interface {
	// Function returns the function ref names, or an error wrapping ErrUnknownFunction.
	Function(ctx context.Context, ref string) (Function, error)
}

// Lister lists every deployed function (used to discover named queues).
type Lister interface {
	Functions(ctx context.Context) ([]Function, error)
}

// FromAnnotations builds a Function from its name and annotations. The provider validates annotations at deploy;
// here a value that does not parse is ignored (no SLO, default percentile, default queue) rather than refused,
// so that the queue never stalls on a function it cannot change. A reserved queue name (the dead letters') is
// ignored too: such a function's calls go to the default queue.
func FromAnnotations(name string, annotations map[string]string) Function {
	f := Function{Name: name, Queue: queue.DefaultQueue, Percentile: contract.DefaultPercentile}
	if q := strings.TrimSpace(annotations[contract.AnnotationQueue]); q != "" && contract.ValidateQueueName(q) == nil {
		f.Queue = q
	}
	if s := strings.TrimSpace(annotations[contract.AnnotationSLO]); s != "" {
		if d, err := time.ParseDuration(s); err == nil && d > 0 {
			f.SLO = d
		}
	}
	if s := strings.TrimSpace(annotations[contract.AnnotationPercentile]); s != "" {
		if p, err := strconv.ParseFloat(s, 64); err == nil && p > 0 && p < 100 {
			f.Percentile = p
		}
	}
	_, f.GPU = annotations[contract.AnnotationMemory]
	return f
}
