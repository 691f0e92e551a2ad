package names

import (
	"errors"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/provider"
)

func TestFunction(t *testing.T) {
	for _, ok := range []string{"echo", "hello-gpu", "f1", "a", strings.Repeat("a", 63)} {
		if err := Function("service", ok); err != nil {
			t.Errorf("Function(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Echo", "-a", "a-", "a.b", "a/b", "..", "a_b", strings.Repeat("a", 64)} {
		err := Function("service", bad)
		if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "service") {
			t.Errorf("Function(%q) = %v, want ErrInvalid naming service", bad, err)
		}
	}
}

func TestSecret(t *testing.T) {
	for _, ok := range []string{"api-key", "db.password", "x"} {
		if err := Secret("name", ok); err != nil {
			t.Errorf("Secret(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "../x", ".hidden", "A"} {
		if err := Secret("name", bad); !errors.Is(err, provider.ErrInvalid) {
			t.Errorf("Secret(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestNamespace(t *testing.T) {
	allowed := []string{provider.DefaultNamespace}
	if ns, err := Namespace("", allowed); err != nil || ns != provider.DefaultNamespace {
		t.Errorf("Namespace(\"\") = %q, %v", ns, err)
	}
	if ns, err := Namespace("openfaas-fn", allowed); err != nil || ns != "openfaas-fn" {
		t.Errorf("Namespace(openfaas-fn) = %q, %v", ns, err)
	}
	if _, err := Namespace("other", allowed); !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), `"other"`) {
		t.Errorf("Namespace(other) = %v, want ErrInvalid naming it", err)
	}
}
