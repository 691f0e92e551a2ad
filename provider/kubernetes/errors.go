package kubernetes

import (
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/faas-gpu/faas-gpu/provider"
)

// APIError wraps an error of the Kubernetes API with the provider sentinel it corresponds to, so that handlers map it
// to an HTTP status: not found, already exists, invalid (the API server's message names the field).
func APIError(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s: %w: %w", what, provider.ErrNotFound, err)
	case apierrors.IsAlreadyExists(err):
		return fmt.Errorf("%s: %w: %w", what, provider.ErrExists, err)
	case apierrors.IsInvalid(err):
		return fmt.Errorf("%s: %w: %w", what, provider.ErrInvalid, err)
	default:
		return fmt.Errorf("%s: %w", what, err)
	}
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
