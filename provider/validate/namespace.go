package validate

import (
	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider/names"
)

// Namespace checks a namespace to create or update: its name (a DNS-1123 label) and its labels and annotations
// (the bounds of a deployment's). Errors wrap provider.ErrInvalid and name the field.
func Namespace(ns types.FunctionNamespace) error {
	if err := names.NamespaceName("name", ns.Name); err != nil {
		return err
	}
	if err := meta("labels", &ns.Labels); err != nil {
		return err
	}
	return meta("annotations", &ns.Annotations)
}
