package venv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// envName matches the folder names Manager.Name gives.
var envName = regexp.MustCompile(`^py[0-9]+\.[0-9]+-[0-9a-f]{16}$`)

// Prune removes what no process uses: the remains of interrupted installs (an environment without its marker or with
// its install's work folder beside it, or that folder alone), and (when MaxAge is set) complete environments no
// function has started on for longer than MaxAge. An environment some process uses (its shared lock is held) or
// installs is left alone. It returns the names removed.
func (m *Manager) Prune(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(m.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("venv: prune: %w", err)
	}
	var names []string
	seen := map[string]bool{}
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), buildSuffix)
		if e.IsDir() && envName.MatchString(name) && !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	var removed []string
	var errs []error
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return removed, err
		}
		ok, err := m.pruneOne(name, time.Now())
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			removed = append(removed, name)
		}
	}
	return removed, errors.Join(errs...)
}

// pruneOne removes one environment if nobody uses or installs it and it is incomplete or unused for MaxAge.
func (m *Manager) pruneOne(name string, now time.Time) (bool, error) {
	dir := filepath.Join(m.cfg.Dir, name)
	use, err := tryLock(dir + useLockSuffix)
	if use == nil {
		return false, err
	}
	defer use.Close()
	inst, err := tryLock(dir + installSuffix)
	if inst == nil {
		return false, err
	}
	defer inst.Close()
	if complete(dir) {
		if m.cfg.MaxAge == 0 {
			return false, nil
		}
		last := time.Time{}
		if st, err := os.Lstat(filepath.Join(dir, usedFile)); err == nil {
			last = st.ModTime()
		}
		if now.Sub(last) <= m.cfg.MaxAge {
			return false, nil
		}
		// Incomplete first, so that an interrupted removal is never taken for a complete environment.
		if err := os.Remove(filepath.Join(dir, markerFile)); err != nil {
			return false, fmt.Errorf("venv: prune %s: %w", name, err)
		}
	}
	// The environment before its build folder: while that is there, nothing takes the environment for complete.
	for _, d := range []string{dir, dir + buildSuffix} {
		if err := removeAll(d); err != nil {
			return false, fmt.Errorf("venv: prune %s: %w", name, err)
		}
	}
	return true, nil
}

// tryLock takes an exclusive lock without waiting; it returns nil (and no error) when someone holds the lock.
func tryLock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("venv: prune: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("venv: prune: lock %s: %w", path, err)
	}
	return f, nil
}
