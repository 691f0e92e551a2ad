package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/faas-gpu/faas-gpu/provider"
)

// clusterConfig holds the flags of the kubernetes and knative backends.
type clusterConfig struct{}

// clusterBackends is what a cluster engine provides to the provider command.
type clusterBackends struct {
	Functions provider.Backend
	Secrets   provider.SecretStore
	Logs      provider.LogSource
}

// registerClusterFlags adds the cluster backends' flags to the provider command's flag set.
func registerClusterFlags(_ *flag.FlagSet) *clusterConfig { return &clusterConfig{} }

// newClusterBackend builds the backend named kind ("kubernetes" or "knative").
func newClusterBackend(_ context.Context, kind string, _ *clusterConfig) (clusterBackends, error) {
	return clusterBackends{}, usageError{fmt.Errorf("--backend %q is not available in this build", kind)}
}
