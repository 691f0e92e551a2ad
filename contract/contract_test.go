package contract_test

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/faas-gpu/faas-gpu/contract"
)

func TestValidateQueueName(t *testing.T) {
	for _, ok := range []string{"faas-request", "slow_queue", "Q1", "faas-dead"} {
		if err := contract.ValidateQueueName(ok); err != nil {
			t.Errorf("ValidateQueueName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a.b", "a b", "a*", "a>", "a/b", "a\\b", "$JS", string(make([]byte, 65))} {
		if err := contract.ValidateQueueName(bad); !errors.Is(err, contract.ErrInvalidQueueName) {
			t.Errorf("ValidateQueueName(%q) = %v, want ErrInvalidQueueName", bad, err)
		}
	}
	// The dead letters' name (and anything starting with it) is reserved.
	for _, reserved := range []string{"faas-dead-letter", "FAAS-DEAD-LETTER", "faas-dead-letter2", "faas-dead-letter_x"} {
		err := contract.ValidateQueueName(reserved)
		if !errors.Is(err, contract.ErrInvalidQueueName) || !errors.Is(err, contract.ErrReservedQueueName) ||
			!strings.Contains(err.Error(), "OF_faas-dead-letter") {
			t.Errorf("ValidateQueueName(%q) = %v, want ErrReservedQueueName naming the dead-letter stream", reserved, err)
		}
	}
}

func TestGPUAnnotations(t *testing.T) {
	for _, a := range []string{contract.AnnotationMemory, contract.AnnotationSLO, contract.AnnotationPercentile,
		contract.AnnotationIsolation, contract.AnnotationScratch, contract.AnnotationModel} {
		if !contract.GPUAnnotation(a) || !strings.HasPrefix(a, contract.AnnotationPrefix) {
			t.Errorf("%s is not a GPU annotation under %s", a, contract.AnnotationPrefix)
		}
	}
	for _, a := range []string{contract.AnnotationQueue, contract.AnnotationPrefix + "memroy", "com.openfaas.gpu"} {
		if contract.GPUAnnotation(a) {
			t.Errorf("%s counts as a GPU annotation", a)
		}
	}
}

// The environment is read in Python (the gpu-python template) and C (the shim): each reads only variables of
// the contract, and every variable of the contract is read by one of them.
func TestTemplateAndShimReadTheContractsEnvironment(t *testing.T) {
	variable := regexp.MustCompile(`\bFAAS_GPU(?:_[A-Z][A-Z0-9_]*[A-Z0-9])?\b`)
	readers := map[string][]string{}
	files := []string{"../template/gpu-python/index.py"}
	shim, err := filepath.Glob("../shim/src/*.c")
	if err != nil || len(shim) == 0 {
		t.Fatalf("the shim's sources: %v", err)
	}
	for _, f := range append(files, shim...) {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range variable.FindAllString(string(src), -1) {
			if !slices.Contains(readers[name], f) {
				readers[name] = append(readers[name], f)
			}
		}
	}
	env := contract.Environment()
	for name, where := range readers {
		if !slices.Contains(env, name) {
			t.Errorf("%v read %s, which package contract does not list", where, name)
		}
	}
	var unread []string
	for _, name := range env {
		if len(readers[name]) == 0 {
			unread = append(unread, name)
		}
	}
	sort.Strings(unread)
	if len(unread) > 0 {
		t.Errorf("neither the template nor the shim reads %v", unread)
	}
}
