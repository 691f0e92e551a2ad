package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/faas-gpu/faas-gpu/gpuserver/server"
	"github.com/faas-gpu/faas-gpu/gpuserver/tenant"
	"github.com/faas-gpu/faas-gpu/gpuserver/topology"
)

// tenantExecutorCommand is the hidden command the gpuserver starts one process of per tenant (docs/tenants.md).
const tenantExecutorCommand = "tenant-executor"

// tenantFlags are the flags of tenant isolation, shared by `up` and `gpuserver`.
type tenantFlags struct {
	isolation    string
	maxTenants   int
	contextBytes string
}

func (t *tenantFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&t.isolation, "tenant-isolation", "process",
		"process: every tenant (a namespace, or a function annotated com.openfaas.gpu.isolation: isolated) runs its "+
			"GPU work in an executor process of its own, so that its kernels reach nothing of another tenant and its "+
			"faults end only its own process (docs/tenants.md); none: every tenant in the gpuserver's process (one "+
			"trusted tenant, or to measure the difference)")
	fs.IntVar(&t.maxTenants, "max-tenants", tenant.DefaultMaxTenants,
		"executor processes at most (one per tenant); a function of one more tenant is refused at registration")
	fs.StringVar(&t.contextBytes, "tenant-context-bytes", "512Mi",
		"GPU memory one executor's contexts take per GPU; the gpuserver leaves max-tenants of them free on a real GPU")
}

func (t *tenantFlags) validate() error {
	switch t.isolation {
	case "process", "none":
	default:
		return usageError{fmt.Errorf("-tenant-isolation %q: want process or none", t.isolation)}
	}
	if t.maxTenants < 1 {
		return usageError{fmt.Errorf("-max-tenants %d: must be at least 1", t.maxTenants)}
	}
	if _, err := topology.ParseSize(t.contextBytes); err != nil {
		return usageError{fmt.Errorf("-tenant-context-bytes %q: %w", t.contextBytes, err)}
	}
	return nil
}

// config is the gpuserver's tenant configuration: nil with -tenant-isolation=none; otherwise executors are this
// binary's hidden tenant-executor command.
func (t *tenantFlags) config(logLevel string) (*server.TenantConfig, error) {
	if t.isolation == "none" {
		return nil, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("tenant executors: this binary's path: %w", err)
	}
	cb, _ := topology.ParseSize(t.contextBytes) // validated
	return &server.TenantConfig{Command: []string{exe, tenantExecutorCommand}, MaxTenants: t.maxTenants,
		ContextBytes: cb, LogLevel: logLevel}, nil
}
