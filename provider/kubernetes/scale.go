package kubernetes

import (
	"context"
	"fmt"
	"math"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/faas-gpu/faas-gpu/provider"
)

// Scale sets the Deployment's desired replicas; 0 stops every replica.
func (b *Backend) Scale(ctx context.Context, namespace, name string, replicas uint64) error {
	ns, err := b.target(namespace, name)
	if err != nil {
		return err
	}
	if replicas > math.MaxInt32 {
		return invalid("replicas", "%d is above %d", replicas, math.MaxInt32)
	}
	n := int32(replicas)
	deployments := b.client.AppsV1().Deployments(ns)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := deployments.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, ok := d.Labels[LabelFunction]; !ok {
			return fmt.Errorf("deployment %s.%s is not a function: %w", name, ns, provider.ErrNotFound)
		}
		if d.Spec.Replicas != nil && *d.Spec.Replicas == n {
			return nil
		}
		d.Spec.Replicas = &n
		_, err = deployments.Update(ctx, d, metav1.UpdateOptions{})
		return err
	})
	return APIError("scale deployment "+name, err)
}
