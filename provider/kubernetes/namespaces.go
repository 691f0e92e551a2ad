package kubernetes

import (
	"context"
	"fmt"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faas-gpu/faas-gpu/provider"
)

// Namespaces lists the default namespace and every namespace labelled openfaas: "1". When the provider may not
// list namespaces (the stock chart's namespaced Role), only the default namespace is returned, as faas-netes does.
func (b *Backend) Namespaces(ctx context.Context) ([]string, error) {
	list, err := b.client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{
		LabelSelector: LabelNamespace + "=" + LabelNamespaceValue,
	})
	if apierrors.IsForbidden(err) {
		return []string{b.cfg.DefaultNamespace}, nil
	}
	if err != nil {
		return nil, APIError("list namespaces", err)
	}
	out := []string{b.cfg.DefaultNamespace}
	for _, n := range list.Items {
		if n.Name != b.cfg.DefaultNamespace {
			out = append(out, n.Name)
		}
	}
	sort.Strings(out[1:])
	return out, nil
}

// CheckNamespace accepts the default namespace and namespaces labelled openfaas: "1"; another namespace is an
// invalid request, and one that does not exist is not found.
func (b *Backend) CheckNamespace(ctx context.Context, namespace string) error {
	if namespace == b.cfg.DefaultNamespace {
		return nil
	}
	ns, err := b.client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	switch {
	case apierrors.IsForbidden(err):
		return invalid("namespace", "%q: only %s is allowed with the provider's namespaced RBAC", namespace, b.cfg.DefaultNamespace)
	case err != nil:
		return APIError("namespace "+namespace, err)
	case ns.Labels[LabelNamespace] != LabelNamespaceValue:
		return fmt.Errorf("%w: namespace: %q is not labelled %s=%q", provider.ErrInvalid, namespace, LabelNamespace, LabelNamespaceValue)
	}
	return nil
}
