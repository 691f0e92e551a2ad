package provider

import (
	"context"

	"github.com/openfaas/faas-provider/types"
)

// NamespaceStore keeps the namespaces functions may be deployed to, as faas-netes keeps Kubernetes namespaces
// labelled for OpenFaaS (faas-cli namespace create/get/update/delete, the OpenFaaS go-sdk). Each namespace is a
// tenant of the node's GPUs (docs/tenants.md). A Backend that implements it lists the same namespaces in
// Namespaces.
type NamespaceStore interface {
	// GetNamespace fails with ErrNotFound for an unknown namespace.
	GetNamespace(ctx context.Context, name string) (types.FunctionNamespace, error)
	// CreateNamespace fails with ErrExists when the namespace exists already.
	CreateNamespace(ctx context.Context, ns types.FunctionNamespace) error
	// UpdateNamespace replaces a namespace's labels and annotations; ErrNotFound for an unknown namespace.
	UpdateNamespace(ctx context.Context, ns types.FunctionNamespace) error
	// DeleteNamespace fails with ErrNotFound for an unknown namespace and ErrInvalid for DefaultNamespace or a
	// namespace that still has functions.
	DeleteNamespace(ctx context.Context, name string) error
}

// LabelOpenFaaS marks a namespace as one OpenFaaS manages (label and annotation "openfaas": "1", as faas-netes and
// the go-sdk set them).
const LabelOpenFaaS = "openfaas"
