package gpuspec

import (
	"errors"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/contract"
	"github.com/faas-gpu/faas-gpu/provider"
)

// com.openfaas.queue is validated at deploy; the dead letters' name is refused.
func TestValidateQueue(t *testing.T) {
	for _, ok := range []map[string]string{nil, {}, {contract.AnnotationQueue: "gpu-batch"}, {contract.AnnotationQueue: " batch_2 "},
		{"com.openfaas.gpu.memory": "1Gi"}} {
		if err := ValidateQueue(ok); err != nil {
			t.Errorf("ValidateQueue(%v) = %v", ok, err)
		}
	}
	for _, bad := range []string{"faas-dead-letter", "faas-dead-letter-2", "FAAS-DEAD-LETTER", "", "a.b", "a b", "a*",
		"a>", "../x", strings.Repeat("q", 65)} {
		err := ValidateQueue(map[string]string{contract.AnnotationQueue: bad})
		if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "annotation com.openfaas.queue") {
			t.Errorf("ValidateQueue(%q) = %v, want ErrInvalid naming the annotation", bad, err)
		}
	}
	if err := ValidateQueue(map[string]string{contract.AnnotationQueue: "faas-dead-letter"}); !strings.Contains(err.Error(), "reserved") {
		t.Errorf("the dead letters' name: %v, want it called reserved", err)
	}
}
