package local

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/openfaas/faas-provider/types"

	"github.com/faas-gpu/faas-gpu/provider"
	"github.com/faas-gpu/faas-gpu/provider/names"
	"github.com/faas-gpu/faas-gpu/provider/validate"
)

// record is what the backend keeps of a function across restarts.
type record struct {
	Deployment types.FunctionDeployment `json:"deployment"`
	Replicas   uint64                   `json:"replicas"`
	CreatedAt  time.Time                `json:"createdAt"`
}

// loadRecords reads every <dir>/<key>.json (the function's key: its name, or name.namespace outside the default
// namespace), sorted by key. A record that cannot be read back as a valid
// deployment (a truncated or hand-edited file) is moved aside to <name>.json.corrupt-<time>, with a loud log line
// naming both files, so that every other function still starts; its function must be deployed again. Only a
// failure to list the folder is an error.
func loadRecords(dir string, maxReplicas uint64, log *slog.Logger, now time.Time) ([]record, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("local backend: reading function records: %w", err)
	}
	var recs []record
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		rec, err := readRecord(path, strings.TrimSuffix(e.Name(), ".json"), maxReplicas)
		if err == nil && validate.Resources(rec.Deployment) != nil {
			// Kept from before limits and requests were validated at deploy: dropped, so that the function (which
			// the local backend runs without them) still starts.
			log.Warn("function record has limits or requests no engine can use: dropped (deploy it again to set "+
				"them)", "file", path, "err", validate.Resources(rec.Deployment))
			rec.Deployment.Limits, rec.Deployment.Requests = nil, nil
		}
		if err != nil {
			aside := path + ".corrupt-" + now.UTC().Format("20060102T150405Z")
			if merr := os.Rename(path, aside); merr != nil {
				log.Error("FUNCTION RECORD IS CORRUPT and could not be moved aside; the function is not restored",
					"file", path, "err", err, "move_err", merr)
				continue
			}
			log.Error("FUNCTION RECORD IS CORRUPT: moved aside; the function is not restored (deploy it again)",
				"file", path, "moved_to", aside, "err", err)
			continue
		}
		recs = append(recs, rec)
	}
	sort.Slice(recs, func(i, j int) bool { return recKey(recs[i]) < recKey(recs[j]) })
	return recs, nil
}

// readRecord reads one record and checks that it is a deployment the backend would accept, of the function whose
// key is key.
func readRecord(path, key string, maxReplicas uint64) (record, error) {
	var rec record
	data, err := os.ReadFile(path)
	if err != nil {
		return rec, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&rec); err != nil {
		return rec, fmt.Errorf("not a function record: %w", err)
	}
	if dec.More() {
		return rec, errors.New("not a function record: data after the record")
	}
	if recKey(rec) != key {
		return rec, fmt.Errorf("the record names function %q of namespace %q, not %q", rec.Deployment.Service,
			rec.Deployment.Namespace, key)
	}
	checked := rec.Deployment
	checked.Limits, checked.Requests = nil, nil // loadRecords drops those it cannot use
	if err := validate.Deployment(checked); err != nil {
		return rec, err
	}
	if rec.Replicas > maxReplicas {
		return rec, fmt.Errorf("%d replicas, more than the maximum of %d", rec.Replicas, maxReplicas)
	}
	if ns := rec.Deployment.Namespace; ns != "" && ns != provider.DefaultNamespace {
		if err := names.NamespaceName("namespace", ns); err != nil {
			return rec, err
		}
	}
	return rec, nil
}

func (b *Backend) recordPath(key string) string {
	return filepath.Join(b.cfg.StateDir, "functions", key+".json")
}

// saveRecord writes a function's record atomically.
func (b *Backend) saveRecord(rec record) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("local backend: encoding record of %q: %w", rec.Deployment.Service, err)
	}
	return writeFileAtomic(b.recordPath(recKey(rec)), data, 0o600)
}

func (b *Backend) removeRecord(key string) error {
	if err := os.Remove(b.recordPath(key)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("local backend: removing record of %q: %w", key, err)
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
