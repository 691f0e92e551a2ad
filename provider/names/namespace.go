package names

import (
	"fmt"

	"github.com/faas-gpu/faas-gpu/provider"
)

// NamespaceName checks the name of a namespace to create: a DNS-1123 label, as a Kubernetes namespace's. Errors wrap
// provider.ErrInvalid and name the field.
func NamespaceName(field, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s is required", provider.ErrInvalid, field)
	case len(name) > 63 || !label.MatchString(name):
		return fmt.Errorf("%w: %s %q is not a valid namespace name (lower-case letters, digits and '-', "+
			"starting and ending with a letter or digit, at most 63 characters)", provider.ErrInvalid, field, name)
	}
	return nil
}
