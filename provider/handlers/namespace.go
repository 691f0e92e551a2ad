package handlers

import (
	"context"
	"fmt"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/names"
)

// namespace returns ns (DefaultNamespace when empty) if the backend serves it, else an error naming it.
func namespace(ctx context.Context, b provider.Backend, ns string) (string, error) {
	allowed, err := b.Namespaces(ctx)
	if err != nil {
		return "", fmt.Errorf("listing namespaces: %w", err)
	}
	return names.Namespace(ns, allowed)
}

// firstNonEmpty returns the first of vs that is not empty.
func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
