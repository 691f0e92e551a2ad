// Package pyenv finds the pinned CUDA 13 / PyTorch Python environment that pyenv.sh creates, for tests that read
// NVIDIA's real binaries (nvcc, libcudart, cuBLAS, cuDNN, libtorch_cuda) at test time. It never creates the
// environment (that downloads about 3.3 GB): tests skip with a reason when it is missing.
package pyenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// ErrMissing: the environment has not been created on this machine.
var ErrMissing = errors.New("the pinned Python environment is missing (create it with `make pyenv`)")

// Dir returns the environment's directory: $FAAS_GPU_PYENV when set, else what pyenv.sh prints when its
// environment is complete.
func Dir() (string, error) {
	if d := os.Getenv("FAAS_GPU_PYENV"); d != "" {
		if _, err := os.Stat(d); err != nil {
			return "", fmt.Errorf("FAAS_GPU_PYENV: %w", err)
		}
		return d, nil
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("pyenv: cannot locate pyenv.sh")
	}
	script := filepath.Join(filepath.Dir(file), "pyenv.sh")
	if err := exec.Command(script, "--check").Run(); err != nil {
		return "", ErrMissing
	}
	out, err := exec.Command(script).Output()
	if err != nil {
		return "", fmt.Errorf("pyenv.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Extra returns the directory of the small extra environment NAME-requirements.txt (pyenv.sh NAME; "openai":
// the OpenAI client), or skips the test: outside `make test-cuda`, or when it has not been created.
func Extra(t testing.TB, name string) string {
	t.Helper()
	if os.Getenv(TierEnv) != "1" {
		t.Skipf("uses the pinned %s environment: runs in `make test-cuda` (%s=1)", name, TierEnv)
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Skip("pyenv: cannot locate pyenv.sh")
	}
	script := filepath.Join(filepath.Dir(file), "pyenv.sh")
	if err := exec.Command(script, "--check", name).Run(); err != nil {
		t.Skipf("needs the pinned %s environment (create it with `test/pyenv/pyenv.sh %s`)", name, name)
	}
	out, err := exec.Command(script, name).Output()
	if err != nil {
		t.Fatalf("pyenv.sh %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

// SitePackages is the environment's site-packages directory.
func SitePackages(dir string) string {
	return filepath.Join(dir, "lib", "python3.11", "site-packages")
}

// CUDA is the directory of the CUDA 13 wheels (bin/nvcc, lib/libcublas.so.13 ...).
func CUDA(dir string) string { return filepath.Join(SitePackages(dir), "nvidia", "cu13") }

// NVCC is the path of the wheel's nvcc.
func NVCC(dir string) string { return filepath.Join(CUDA(dir), "bin", "nvcc") }

// TierEnv is the variable `make test-cuda` sets: tests that read NVIDIA's binaries run only in that tier, so that
// `make test` stays fast on a machine where the environment happens to exist.
const TierEnv = "FAAS_GPU_TEST_PYENV"

// RequireTier skips a test outside `make test-cuda` (TierEnv unset): tests that download from PyPI (what says what
// they download) run only in that tier beside those that read NVIDIA's binaries, so that `make test` passes
// offline once the pinned caches exist.
func RequireTier(t testing.TB, what string) {
	t.Helper()
	if os.Getenv(TierEnv) != "1" {
		t.Skipf("%s: runs in `make test-cuda` (%s=1)", what, TierEnv)
	}
}

// Require returns the environment's directory, or skips the test: outside `make test-cuda` (TierEnv unset), or
// naming what is missing.
func Require(t testing.TB) string {
	t.Helper()
	if os.Getenv(TierEnv) != "1" {
		t.Skipf("reads NVIDIA's CUDA 13 binaries: runs in `make test-cuda` (%s=1)", TierEnv)
	}
	dir, err := Dir()
	if err != nil {
		t.Skipf("needs NVIDIA's CUDA 13 binaries from the pinned Python environment: %v", err)
	}
	return dir
}

// Library returns the path of a file of the environment (relative to site-packages, e.g.
// "torch/lib/libtorch_cuda.so") or skips the test when it is absent.
func Library(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join(SitePackages(Require(t)), rel)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("needs %s from the pinned Python environment: %v", rel, err)
	}
	return p
}
