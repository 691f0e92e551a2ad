package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// envFlags are the local backend's flags for the Python environments of functions with pip requirements (package
// provider/local/venv), shared by `up` and `provider`.
type envFlags struct {
	dir    string
	maxAge time.Duration
}

func (e *envFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&e.dir, "env-dir", "",
		"Python environments of functions with pip requirements, one per distinct requirements, shared and kept "+
			"across restarts (default: $FAAS_GPU_CACHE/envs, else <user cache dir>/faas-gpu/envs, e.g. "+
			"~/.cache/faas-gpu/envs)")
	fs.DurationVar(&e.maxAge, "env-max-age", 30*24*time.Hour,
		"at start, remove environments no function has started on for this long; 0 keeps them")
}

func (e *envFlags) validate() error {
	if e.maxAge < 0 {
		return usageError{fmt.Errorf("-env-max-age %s: must not be negative", e.maxAge)}
	}
	return nil
}

// resolvedDir is the environment folder: the flag's value made absolute, else $FAAS_GPU_CACHE/envs (the cache the
// Makefile and the test tiers share), else the user cache dir's faas-gpu/envs, else <stateDir>/envs when the user
// has no cache dir.
func (e *envFlags) resolvedDir(stateDir string) (string, error) {
	if e.dir != "" {
		abs, err := filepath.Abs(e.dir)
		if err != nil {
			return "", usageError{fmt.Errorf("-env-dir: %w", err)}
		}
		return abs, nil
	}
	if cache := os.Getenv("FAAS_GPU_CACHE"); cache != "" {
		if abs, err := filepath.Abs(cache); err == nil {
			return filepath.Join(abs, "envs"), nil
		}
	}
	if cache, err := os.UserCacheDir(); err == nil {
		return filepath.Join(cache, "faas-gpu", "envs"), nil
	}
	return filepath.Join(stateDir, "envs"), nil
}
