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
		contract.AnnotationIsolation, contract.AnnotationScratch, contract.AnnotationModel,
		contract.AnnotationComputeRequest, contract.AnnotationComputeLimit} {
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

func TestParseShare(t *testing.T) {
	good := map[string]float64{"1": 1, "0.3": 0.3, " 0.25 ": 0.25, "30%": 0.3, "100%": 1, "5 %": 0.05, "1e-2": 0.01}
	for in, want := range good {
		if got, err := contract.ParseShare(in); err != nil || got != want {
			t.Errorf("ParseShare(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "%", "half", "0", "0%", "-0.1", "30", "1.01", "101%", "NaN", "Inf", "0x1p-2%x"} {
		if got, err := contract.ParseShare(bad); !errors.Is(err, contract.ErrInvalidShare) {
			t.Errorf("ParseShare(%q) = %v, %v; want ErrInvalidShare", bad, got, err)
		}
	}
}

func TestShares(t *testing.T) {
	for _, tt := range []struct{ r, l, wantR, wantL float64 }{
		{0, 0, 1, 1},       // neither named: exclusive
		{0.3, 0, 0.3, 1},   // a request alone may grow to the whole GPU
		{0, 0.5, 0.5, 0.5}, // a limit alone is a static share
		{0.2, 0.7, 0.2, 0.7},
	} {
		if r, l := contract.Shares(tt.r, tt.l); r != tt.wantR || l != tt.wantL {
			t.Errorf("Shares(%v, %v) = %v, %v; want %v, %v", tt.r, tt.l, r, l, tt.wantR, tt.wantL)
		}
	}
	if err := contract.CheckShares(0.8, 0.5); !errors.Is(err, contract.ErrInvalidShare) ||
		!strings.Contains(err.Error(), contract.AnnotationComputeRequest) {
		t.Errorf("CheckShares(0.8, 0.5) = %v, want an error naming %s", err, contract.AnnotationComputeRequest)
	}
	if err := contract.CheckShares(0, 1.5); !errors.Is(err, contract.ErrInvalidShare) ||
		!strings.Contains(err.Error(), contract.AnnotationComputeLimit) {
		t.Errorf("CheckShares(0, 1.5) = %v, want an error naming %s", err, contract.AnnotationComputeLimit)
	}
}
