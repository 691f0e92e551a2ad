// Package names checks the names of functions, secrets and namespaces that the provider accepts. A function's name
// becomes a folder, a process name and (in a cluster) a Kubernetes object name, so it must be a DNS-1123 label.
package names

import (
	"fmt"
	"regexp"

	"github.com/faas-gpu/faas-gpu/provider"
)

var (
	label     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)
)

// Function checks a function name (field names the request field it came from, e.g. "service"). Errors wrap
// provider.ErrInvalid and name the field.
func Function(field, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s is required", provider.ErrInvalid, field)
	case len(name) > 63 || !label.MatchString(name):
		return fmt.Errorf("%w: %s %q is not a valid function name (lower-case letters, digits and '-', "+
			"starting and ending with a letter or digit, at most 63 characters)", provider.ErrInvalid, field, name)
	}
	return nil
}

// Secret checks a secret name (a DNS-1123 subdomain, so also a safe file name). Errors wrap provider.ErrInvalid and
// name the field.
func Secret(field, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s is required", provider.ErrInvalid, field)
	case len(name) > 253 || !subdomain.MatchString(name):
		return fmt.Errorf("%w: %s %q is not a valid secret name (lower-case letters, digits, '-' and '.', "+
			"starting and ending with a letter or digit)", provider.ErrInvalid, field, name)
	}
	return nil
}

// Namespace returns ns, or provider.DefaultNamespace when ns is empty, if it is one of allowed; otherwise an error
// wrapping provider.ErrInvalid that names the namespace.
func Namespace(ns string, allowed []string) (string, error) {
	if ns == "" {
		ns = provider.DefaultNamespace
	}
	for _, a := range allowed {
		if a == ns {
			return ns, nil
		}
	}
	return "", fmt.Errorf("%w: namespace %q is not available (namespaces: %v)", provider.ErrInvalid, ns, allowed)
}
