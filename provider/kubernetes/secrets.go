package kubernetes

import (
	"context"
	"sort"
	"strings"

	"github.com/openfaas/faas-provider/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// ListSecrets returns the names of the namespace's OpenFaaS secrets (label app.kubernetes.io/managed-by=openfaas).
func (b *Backend) ListSecrets(ctx context.Context, namespace string) ([]types.Secret, error) {
	ns := b.cfg.namespace(namespace)
	list, err := b.client.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{
		LabelSelector: LabelSecretManagedBy + "=" + SecretManagedByValue,
	})
	if err != nil {
		return nil, APIError("list secrets in "+ns, err)
	}
	out := make([]types.Secret, 0, len(list.Items))
	for _, s := range list.Items {
		out = append(out, types.Secret{Name: s.Name, Namespace: ns})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// CreateSecret stores the value under the key named like the secret, so the function reads
// /var/openfaas/secrets/<name>.
func (b *Backend) CreateSecret(ctx context.Context, s types.Secret) error {
	ns, err := b.secretTarget(&s)
	if err != nil {
		return err
	}
	if err := b.CheckNamespace(ctx, ns); err != nil {
		return err
	}
	obj := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name, Namespace: ns,
			Labels: map[string]string{LabelSecretManagedBy: SecretManagedByValue},
		},
		Type: corev1.SecretTypeOpaque,
		Data: secretData(s),
	}
	_, err = b.client.CoreV1().Secrets(ns).Create(ctx, obj, metav1.CreateOptions{})
	return APIError("create secret "+s.Name, err)
}

// UpdateSecret replaces the value of an OpenFaaS secret.
func (b *Backend) UpdateSecret(ctx context.Context, s types.Secret) error {
	ns, err := b.secretTarget(&s)
	if err != nil {
		return err
	}
	secrets := b.client.CoreV1().Secrets(ns)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := secrets.Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Data = secretData(s)
		cur.StringData = nil
		if cur.Labels == nil {
			cur.Labels = map[string]string{}
		}
		cur.Labels[LabelSecretManagedBy] = SecretManagedByValue
		_, err = secrets.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	return APIError("update secret "+s.Name, err)
}

// DeleteSecret removes a secret.
func (b *Backend) DeleteSecret(ctx context.Context, namespace, name string) error {
	s := types.Secret{Name: name, Namespace: namespace}
	ns, err := b.secretTarget(&s)
	if err != nil {
		return err
	}
	return APIError("delete secret "+name, b.client.CoreV1().Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{}))
}

func (b *Backend) secretTarget(s *types.Secret) (string, error) {
	ns := b.cfg.namespace(s.Namespace)
	if errs := validation.IsDNS1123Subdomain(s.Name); len(errs) > 0 {
		return ns, invalid("name", "%q: %s", s.Name, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return ns, invalid("namespace", "%q: %s", ns, strings.Join(errs, "; "))
	}
	return ns, nil
}

func secretData(s types.Secret) map[string][]byte {
	if len(s.RawValue) > 0 {
		return map[string][]byte{s.Name: s.RawValue}
	}
	return map[string][]byte{s.Name: []byte(s.Value)}
}

// LookupSecrets fetches the named secrets of a namespace; a name that does not exist is an invalid request naming
// the field secrets.
func LookupSecrets(ctx context.Context, client kubernetes.Interface, namespace string, names []string) (map[string]*corev1.Secret, error) {
	out := make(map[string]*corev1.Secret, len(names))
	for _, name := range names {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, invalid("secrets", "%q: %s", name, strings.Join(errs, "; "))
		}
		s, err := client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			if isNotFound(err) {
				return nil, invalid("secrets", "secret %q does not exist in namespace %s", name, namespace)
			}
			return nil, APIError("get secret "+name, err)
		}
		out[name] = s
	}
	return out, nil
}
