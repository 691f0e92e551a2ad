package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/openfaas/faas-provider/types"
)

// record is what the backend keeps of a function across restarts.
type record struct {
	Deployment types.FunctionDeployment `json:"deployment"`
	Replicas   uint64                   `json:"replicas"`
	CreatedAt  time.Time                `json:"createdAt"`
}

// loadRecords reads every <dir>/<name>.json, sorted by name.
func loadRecords(dir string) ([]record, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("local backend: reading function records: %w", err)
	}
	var recs []record
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("local backend: reading function record: %w", err)
		}
		var rec record
		if err := json.Unmarshal(data, &rec); err != nil {
			return nil, fmt.Errorf("local backend: function record %s: %w", path, err)
		}
		if rec.Deployment.Service+".json" != e.Name() {
			return nil, fmt.Errorf("local backend: function record %s names function %q", path, rec.Deployment.Service)
		}
		recs = append(recs, rec)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Deployment.Service < recs[j].Deployment.Service })
	return recs, nil
}

func (b *Backend) recordPath(name string) string {
	return filepath.Join(b.cfg.StateDir, "functions", name+".json")
}

// saveRecord writes a function's record atomically.
func (b *Backend) saveRecord(rec record) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("local backend: encoding record of %q: %w", rec.Deployment.Service, err)
	}
	return writeFileAtomic(b.recordPath(rec.Deployment.Service), data, 0o600)
}

func (b *Backend) removeRecord(name string) error {
	if err := os.Remove(b.recordPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("local backend: removing record of %q: %w", name, err)
	}
	return nil
}

// writeFileAtomic writes data to a temporary file in path's folder, syncs it and renames it over path, so that a
// reader sees either the old or the new content, never a partial one.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	ok = true
	return nil
}
