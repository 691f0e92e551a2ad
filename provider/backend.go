// Package provider holds the contracts between faas-gpu's faas-provider handlers and the engines that run
// functions: local processes, Kubernetes Deployments or Knative Services.
package provider

import (
	"context"
	"net/url"

	"github.com/openfaas/faas-provider/logs"
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/gpuserver/pool"
)

// DefaultNamespace is the namespace functions live in when a request names none.
const DefaultNamespace = "openfaas-fn"

// Backend runs functions on one engine. Every method takes the function namespace; an empty namespace means
// DefaultNamespace. Errors wrap the sentinels in errors.go so that handlers map them to HTTP statuses in one place.
type Backend interface {
	// Deploy creates a function. It fails with ErrExists when the function exists already.
	Deploy(ctx context.Context, fn types.FunctionDeployment) error
	// Update replaces the definition of a function. It fails with ErrNotFound for an unknown function, which makes
	// faas-cli fall back to Deploy.
	Update(ctx context.Context, fn types.FunctionDeployment) error
	// Delete removes a function and stops its replicas.
	Delete(ctx context.Context, namespace, name string) error
	// List returns every function of a namespace.
	List(ctx context.Context, namespace string) ([]types.FunctionStatus, error)
	// Status returns one function, with its desired and available replicas.
	Status(ctx context.Context, namespace, name string) (types.FunctionStatus, error)
	// Scale sets the desired replica count (0 stops every replica).
	Scale(ctx context.Context, namespace, name string, replicas uint64) error
	// Resolve returns the base URL of a ready replica. It fails with ErrNotReady when none is ready.
	Resolve(ctx context.Context, namespace, name string) (*url.URL, error)
	// Namespaces lists the namespaces functions may be deployed to.
	Namespaces(ctx context.Context) ([]string, error)
}

// SecretStore keeps function secrets. Functions see each secret they name as a file, the way OpenFaaS mounts them
// (/var/openfaas/secrets/<name> in a container; a per-function folder named by OPENFAAS_SECRETS_DIR locally).
type SecretStore interface {
	// ListSecrets returns the names of a namespace's secrets; values are never listed.
	ListSecrets(ctx context.Context, namespace string) ([]types.Secret, error)
	// CreateSecret fails with ErrExists when the secret exists already.
	CreateSecret(ctx context.Context, s types.Secret) error
	// UpdateSecret fails with ErrNotFound for an unknown secret.
	UpdateSecret(ctx context.Context, s types.Secret) error
	// DeleteSecret fails with ErrNotFound for an unknown secret.
	DeleteSecret(ctx context.Context, namespace, name string) error
}

// LogSource streams a function's output. The channel is closed when the request is satisfied (no follow) or ctx
// ends (follow).
type LogSource interface {
	Logs(ctx context.Context, req logs.Request) (<-chan logs.Message, error)
}

// GPURegistry tells the node's gpuserver which functions are GPU functions and what they require.
type GPURegistry interface {
	// Register adds or updates a GPU function; calling it again with the same name replaces its requirements.
	Register(ctx context.Context, spec pool.FunctionSpec) error
	// Deregister removes a GPU function; unknown names are not an error.
	Deregister(ctx context.Context, name string) error
}

// Router is implemented by backends that pick a function's replica themselves (local). The proxy prefers it over
// Resolve: Route waits for a replica to become ready, and the backend learns when each request ends, so that a
// replica being replaced (an update, a scale-down) stops only after the requests it was given have ended.
type Router interface {
	// Route returns the base URL of a ready replica and a func the caller must call once the request has ended.
	// While the function's replicas are starting it waits, until one is ready or ctx ends (ErrNotReady wrapping
	// ctx's error). A function at zero replicas is scaled up first (scale from zero: concurrent calls start its
	// replicas once). It fails soon with ErrNotReady when the replicas keep exiting before they are ready (the error
	// says how the last one ended).
	Route(ctx context.Context, namespace, name string) (u *url.URL, done func(), err error)
}
